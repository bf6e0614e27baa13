//! Database files as the analysis and measurement tools read them: split into pages, the last
//! partial page of each file zero-padded; sample pages spread over them to calibrate Algorithm
//! 1's decompression costs on this machine; and the two flags that shape both (`--page-size`,
//! `--tie-rate`).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use tundra_codec::{DecompressCost, PageCodec, PageSize, SelectorConfig, calibration_pages};
use tundra_device::size::parse_size;

/// Real pages timed to calibrate the decompression costs, besides the synthetic ones.
const CALIBRATION_SAMPLES: u64 = 24;

/// The selector's thresholds for `--tie-rate`: the paper's, with the tie rule at `rate`.
pub fn selector_config(tie_rate: &str) -> Result<SelectorConfig> {
    let tie_bytes_per_us = match tie_rate {
        "off" => None,
        rate => Some(
            rate.parse::<f64>()
                .ok()
                .filter(|r| r.is_finite() && *r > 0.0)
                .ok_or_else(|| anyhow::anyhow!("--tie-rate {rate:?}: give a positive number of B/µs or `off`"))?,
        ),
    };
    Ok(SelectorConfig { tie_bytes_per_us, ..SelectorConfig::default() })
}

/// The page size `--page-size` names: 8 KiB or 16 KiB.
pub fn parse_page_size(text: &str) -> Result<PageSize> {
    let bytes = parse_size(text).with_context(|| format!("--page-size {text}"))?;
    PageSize::from_bytes(bytes)
        .map_err(|_| anyhow::anyhow!("--page-size {text}: only pages of 8KiB or 16KiB are supported"))
}

/// One input file, open for positional reads from every worker.
pub struct InputFile {
    pub path: PathBuf,
    file: File,
    pub bytes: u64,
}

/// Opens every file for reading; each must be a regular file.
pub fn open_files(paths: &[PathBuf]) -> Result<Vec<InputFile>> {
    paths
        .iter()
        .map(|path| {
            let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
            let metadata = file.metadata().with_context(|| format!("examining {}", path.display()))?;
            if !metadata.is_file() {
                bail!("{} is not a regular file", path.display());
            }
            Ok(InputFile { path: path.clone(), file, bytes: metadata.len() })
        })
        .collect()
}

/// Reads `buf.len()` bytes at `offset`; what lies past the end of the file stays zero.
pub fn read_padded(input: &InputFile, offset: u64, buf: &mut [u8]) -> Result<()> {
    buf.fill(0);
    let mut filled = 0;
    while filled < buf.len() {
        let n = input
            .file
            .read_at(&mut buf[filled..], offset + filled as u64)
            .with_context(|| format!("reading {}", input.path.display()))?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    Ok(())
}

/// Calibrates the decompression costs on pages spread evenly over the input, plus synthetic pages
/// that spread the compressed sizes.
pub fn calibrate(codec: &PageCodec, files: &[InputFile], page_size: PageSize, pages: u64) -> Result<DecompressCost> {
    assert!(pages > 0, "the callers refuse empty input before calibrating");
    let page_bytes = page_size.bytes() as u64;
    let mut samples = calibration_pages(page_size);
    let step = pages.div_ceil(CALIBRATION_SAMPLES);
    let mut first_page = 0u64;
    for input in files {
        let file_pages = input.bytes.div_ceil(page_bytes);
        // Every page whose global index is a multiple of `step`.
        let mut index = first_page.div_ceil(step) * step;
        while index < first_page + file_pages {
            let mut page = vec![0u8; page_size.bytes()];
            read_padded(input, (index - first_page) * page_bytes, &mut page)?;
            samples.push(page);
            index += step;
        }
        first_page += file_pages;
    }
    let refs: Vec<&[u8]> = samples.iter().map(Vec::as_slice).collect();
    DecompressCost::calibrate(codec, &refs).context("calibrating decompression costs")
}
