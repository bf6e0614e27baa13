//! How long a page takes to decompress on this machine, for Algorithm 1's overhead term
//! (seed 000 §3.3.2, line 11).
//!
//! The paper compares the decompression latencies of both algorithms for each page. Timing every
//! candidate page as it is written would make each decision depend on scheduler noise at the
//! microsecond scale (a preempted run flips the choice), would cost two more decompressions per
//! write, and could not be tested deterministically. Instead [`DecompressCost`] is calibrated
//! once, at startup, by timing both algorithms on sample pages, and fits per algorithm a line
//! `fixed_us + us_per_byte * compressed_bytes`: the output (a page) is the same size every time,
//! so the work that varies is the compressed input to be parsed and entropy-decoded. The
//! decision is then a pure function of the page's compressed sizes and the fitted model.
//!
//! Timing is itself a source of nondeterminism, so it happens only where a real node starts.
//! Simulation, tests and tools that must not time anything take [`DecompressCost::nominal`], a
//! fixed model measured once.

use std::time::Instant;

use crate::codec::Encoding;
use crate::samples::{random_bytes, text_bytes};
use crate::{Algorithm, Error, PageCodec, PageSize, Result, blocks_4k};

/// Decompression time as a line in the compressed size.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinearCost {
    pub fixed_us: f64,
    pub us_per_byte: f64,
}

impl LinearCost {
    /// Estimated microseconds to decompress `compressed_bytes` into a page; never negative.
    pub fn estimate_us(&self, compressed_bytes: usize) -> f64 {
        (self.fixed_us + self.us_per_byte * compressed_bytes as f64).max(0.0)
    }
}

/// The decompression cost model of both algorithms for one page size.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecompressCost {
    pub page_size: PageSize,
    pub lz4: LinearCost,
    pub zstd: LinearCost,
}

/// Timed rounds per sample page and algorithm; the median round counts.
const ROUNDS: usize = 5;
/// Decompressions per round, so that a round lasts tens of microseconds, well above the clock's
/// resolution.
const REPEATS: usize = 8;

impl DecompressCost {
    /// Estimated microseconds to read a page stored with `encoding` in `stored_bytes` bytes. A
    /// raw page needs no decompression.
    pub fn estimate_us(&self, encoding: Encoding, stored_bytes: usize) -> f64 {
        match encoding {
            Encoding::Raw => 0.0,
            Encoding::Compressed(Algorithm::Lz4) => self.lz4.estimate_us(stored_bytes),
            Encoding::Compressed(Algorithm::Zstd) => self.zstd.estimate_us(stored_bytes),
        }
    }

    /// A fixed model for simulation, tests and tools that must not time anything, so that their
    /// choices are the same on every machine and every run.
    ///
    /// The coefficients are rounded from [`DecompressCost::calibrate`] on [`calibration_pages`]
    /// (what a node calibrates on), measured once in a release build on the 2-core AMD EPYC
    /// machine the project is developed on, five runs per page size, which agreed within a few
    /// percent: an 8 KiB page costs lz4 0.35 ns per compressed byte (the fixed part came out
    /// under 0.05 µs) and zstd 2.1 µs plus 1.45 ns per byte; a 16 KiB page lz4 0.52 µs plus
    /// 0.28 ns per byte and zstd 5.0 µs plus 0.86 ns per byte. Other machines differ; a node
    /// calibrates on its own.
    pub fn nominal(page_size: PageSize) -> DecompressCost {
        let line = |fixed_us, ns_per_byte: f64| LinearCost { fixed_us, us_per_byte: ns_per_byte / 1000.0 };
        match page_size {
            PageSize::Kib8 => DecompressCost { page_size, lz4: line(0.0, 0.35), zstd: line(2.1, 1.45) },
            PageSize::Kib16 => DecompressCost { page_size, lz4: line(0.52, 0.28), zstd: line(5.0, 0.86) },
        }
    }

    /// Times both algorithms decompressing `pages` (all of one size; real pages of the data the
    /// model is for, ideally, with sizes spread by [`calibration_pages`]) and fits the model.
    /// Takes tens of milliseconds for a few dozen pages.
    pub fn calibrate(codec: &PageCodec, pages: &[&[u8]]) -> Result<DecompressCost> {
        let Some(first) = pages.first() else {
            return Err(Error::invalid("calibration needs at least one sample page"));
        };
        let page_size = PageSize::of(first)?;
        let mut out = vec![0u8; page_size.bytes()];
        let mut fit = |algorithm| -> Result<LinearCost> {
            let mut stored = Vec::with_capacity(pages.len());
            let mut raw = Vec::new();
            for page in pages {
                if page.len() != page_size.bytes() {
                    return Err(Error::invalid("calibration pages are not all of one size"));
                }
                let compressed = codec.compress(algorithm, page)?;
                let point = (compressed.len() as f64, time_decompression_us(codec, algorithm, &compressed, &mut out)?);
                // A page that saves no block is stored raw and never decompressed, and its timing
                // (zstd copies stored blocks at memory speed) would bend the line the wrong way.
                // Only when no page saves a block is there nothing better to fit.
                if blocks_4k(compressed.len()) < page_size.blocks_4k() { stored.push(point) } else { raw.push(point) }
            }
            Ok(fit_linear(if stored.is_empty() { &raw } else { &stored }))
        };
        let lz4 = fit(Algorithm::Lz4)?;
        let zstd = fit(Algorithm::Zstd)?;
        Ok(DecompressCost { page_size, lz4, zstd })
    }
}

/// The median time of one decompression of `compressed`, in microseconds.
fn time_decompression_us(codec: &PageCodec, algorithm: Algorithm, compressed: &[u8], out: &mut [u8]) -> Result<f64> {
    // The first run warms the caches and checks the data.
    codec.decompress_into(algorithm, compressed, out)?;
    let mut rounds_us = [0.0f64; ROUNDS];
    for round in &mut rounds_us {
        let start = Instant::now();
        for _ in 0..REPEATS {
            codec.decompress_into(algorithm, std::hint::black_box(compressed), out)?;
            std::hint::black_box(&mut *out);
        }
        *round = start.elapsed().as_secs_f64() * 1e6 / REPEATS as f64;
    }
    rounds_us.sort_by(f64::total_cmp);
    Ok(rounds_us[ROUNDS / 2])
}

/// Least-squares line through `(compressed_bytes, us)` points. A slope that the points cannot
/// determine (one distinct size) or that comes out negative (noise: more input never makes
/// decompression cheaper) is taken as zero, with the mean as the fixed cost; a negative fixed
/// cost gives way to the least-squares line through the origin.
pub fn fit_linear(points: &[(f64, f64)]) -> LinearCost {
    assert!(!points.is_empty(), "a fit needs points");
    let n = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    if sxx <= f64::EPSILON * n || sxy <= 0.0 {
        return LinearCost { fixed_us: mean_y, us_per_byte: 0.0 };
    }
    let slope = sxy / sxx;
    let fixed_us = mean_y - slope * mean_x;
    if fixed_us < 0.0 {
        // A negative fixed cost is noise too: fit a line through the origin instead.
        let sum_xy: f64 = points.iter().map(|p| p.0 * p.1).sum();
        let sum_xx: f64 = points.iter().map(|p| p.0 * p.0).sum();
        return LinearCost { fixed_us: 0.0, us_per_byte: sum_xy / sum_xx };
    }
    LinearCost { fixed_us, us_per_byte: slope }
}

/// Synthetic pages from highly compressible to barely compressible, so that a calibration sees a
/// spread of compressed sizes even when the real sample pages are all alike. Like database pages,
/// they are rows followed by free space (zeros), some with incompressible values mixed in.
pub fn calibration_pages(page_size: PageSize) -> Vec<Vec<u8>> {
    // (percent random, percent text); the rest of the page is zeros.
    const MIXES: [(usize, usize); 10] =
        [(0, 100), (0, 80), (0, 65), (0, 50), (0, 35), (0, 20), (5, 50), (10, 40), (20, 30), (35, 45)];
    let bytes = |percent: usize| page_size.bytes() * percent / 100;
    MIXES
        .iter()
        .enumerate()
        .map(|(seed, &(random, text))| {
            let mut page = random_bytes(bytes(random), seed as u64);
            page.extend_from_slice(&text_bytes(bytes(text), seed as u64));
            page.resize(page_size.bytes(), 0);
            page
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_recovers_a_line() {
        let points: Vec<(f64, f64)> = (0..10).map(|i| (i as f64 * 1000.0, 2.0 + 0.003 * i as f64 * 1000.0)).collect();
        let fit = fit_linear(&points);
        assert!((fit.fixed_us - 2.0).abs() < 1e-9, "{fit:?}");
        assert!((fit.us_per_byte - 0.003).abs() < 1e-12, "{fit:?}");
        assert!((fit.estimate_us(5000) - 17.0).abs() < 1e-9);
    }

    #[test]
    fn undetermined_or_negative_slopes_are_flat() {
        assert_eq!(fit_linear(&[(100.0, 4.0), (100.0, 6.0)]), LinearCost { fixed_us: 5.0, us_per_byte: 0.0 });
        assert_eq!(fit_linear(&[(100.0, 6.0), (200.0, 4.0)]), LinearCost { fixed_us: 5.0, us_per_byte: 0.0 });
        assert_eq!(LinearCost { fixed_us: -5.0, us_per_byte: 0.001 }.estimate_us(10), 0.0);
        // The best line would start below zero: through the origin instead.
        let through_origin = fit_linear(&[(1000.0, 1.0), (2000.0, 3.0)]);
        assert_eq!(through_origin.fixed_us, 0.0);
        assert!((through_origin.us_per_byte - 7.0 / 5000.0).abs() < 1e-12, "{through_origin:?}");
    }

    #[test]
    fn raw_pages_cost_nothing_to_decompress() {
        let line = LinearCost { fixed_us: 1.0, us_per_byte: 0.001 };
        let cost = DecompressCost { page_size: PageSize::Kib16, lz4: line, zstd: line };
        assert_eq!(cost.estimate_us(Encoding::Raw, 16384), 0.0);
        assert_eq!(cost.estimate_us(Encoding::Compressed(Algorithm::Zstd), 1000), 2.0);
    }

    /// The nominal model is the kind of model calibration gives: zstd costs more than lz4 at
    /// every size a stored page can have, and a compressed page costs more than a raw one.
    #[test]
    fn nominal_costs_are_ordered_like_calibrated_ones() {
        for page_size in [PageSize::Kib8, PageSize::Kib16] {
            let cost = DecompressCost::nominal(page_size);
            assert_eq!(cost.page_size, page_size);
            for stored in [1, 100, 4096, page_size.bytes() - 4096] {
                let lz4 = cost.estimate_us(Encoding::Compressed(Algorithm::Lz4), stored);
                let zstd = cost.estimate_us(Encoding::Compressed(Algorithm::Zstd), stored);
                assert!(0.0 < lz4 && lz4 < zstd, "{page_size}: {stored} B: lz4 {lz4} µs, zstd {zstd} µs");
            }
        }
    }

    /// Calibration runs on whatever machine runs the tests, so only the model's shape is checked,
    /// never a time.
    #[test]
    fn calibration_gives_a_usable_model() {
        let pages = calibration_pages(PageSize::Kib8);
        let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
        let codec = PageCodec::default();
        for algorithm in [Algorithm::Lz4, Algorithm::Zstd] {
            let saving = pages.iter().filter(|p| codec.encode(algorithm, p).unwrap().blocks_4k() < 2).count();
            assert!(saving >= 4, "{algorithm}: only {saving} calibration pages save a block");
        }
        let cost = DecompressCost::calibrate(&codec, &refs).unwrap();
        assert_eq!(cost.page_size, PageSize::Kib8);
        for line in [cost.lz4, cost.zstd] {
            assert!(line.fixed_us.is_finite() && line.us_per_byte.is_finite() && line.us_per_byte >= 0.0);
        }
        assert!(DecompressCost::calibrate(&PageCodec::default(), &[]).is_err());
        // Pages that all stay raw still give a model (there is nothing better to fit).
        let random = random_bytes(8192, 1);
        assert!(DecompressCost::calibrate(&PageCodec::default(), &[&random]).is_ok());
        assert!(DecompressCost::calibrate(&PageCodec::default(), &[&pages[0], &[0u8; 16384]]).is_err());
    }
}
