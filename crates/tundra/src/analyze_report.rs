//! The report of `tundra analyze`: the JSON document (stable keys, docs/cli.md) and the Markdown
//! tables for people, both made from the same [`Report`].

use std::fmt::Write;

use serde::Serialize;
use tundra_codec::{LinearCost, PageSize, Selector};

use crate::analyze::{GRANULARITY_INPUT, INPUT_SIZES, LayerBytes, Totals};

/// What the report says about how the analysis ran.
pub struct Input<'a> {
    /// Each file's path and length.
    pub files: Vec<(String, u64)>,
    pub page_size: PageSize,
    pub zstd_level: i32,
    pub deflate_level: i32,
    pub selector: &'a Selector,
}

/// `logical / stored`, or None when nothing is stored (all zeros: the drive stores nothing).
fn ratio(logical: u64, stored: u64) -> Option<f64> {
    (stored > 0).then(|| logical as f64 / stored as f64)
}

/// How many percent more `more` is than `less`, or None when `less` is 0.
fn extra_percent(more: u64, less: u64) -> Option<f64> {
    (less > 0).then(|| (more as f64 / less as f64 - 1.0) * 100.0)
}

/// `part` as a percentage of `whole`, or None when `whole` is 0.
fn share_percent(part: u64, whole: u64) -> Option<f64> {
    (whole > 0).then(|| part as f64 * 100.0 / whole as f64)
}

#[derive(Serialize)]
pub struct Report {
    files: Vec<FileJson>,
    page_size: usize,
    pages: u64,
    logical_bytes: u64,
    zero_pages: u64,
    zstd_level: i32,
    deflate_level: i32,
    drive_only_bytes: u64,
    drive_only_ratio: Option<f64>,
    algorithms: Algorithms,
    adaptive_mix: AdaptiveMix,
    figure2: Figure2,
    figure5c: Figure5c,
    selector: SelectorJson,
}

#[derive(Serialize)]
struct FileJson {
    path: String,
    bytes: u64,
}

#[derive(Serialize)]
struct Algorithms {
    lz4: AlgorithmJson,
    zstd: AlgorithmJson,
    adaptive: AlgorithmJson,
}

#[derive(Serialize)]
struct AlgorithmJson {
    software_bytes: u64,
    software_ratio: Option<f64>,
    software_4k_bytes: u64,
    software_4k_ratio: Option<f64>,
    dual_layer_bytes: u64,
    dual_layer_ratio: Option<f64>,
    raw_pages: u64,
}

impl AlgorithmJson {
    fn new(logical: u64, bytes: &LayerBytes) -> AlgorithmJson {
        AlgorithmJson {
            software_bytes: bytes.software,
            software_ratio: ratio(logical, bytes.software),
            software_4k_bytes: bytes.software_4k,
            software_4k_ratio: ratio(logical, bytes.software_4k),
            dual_layer_bytes: bytes.dual_layer,
            dual_layer_ratio: ratio(logical, bytes.dual_layer),
            raw_pages: bytes.raw_pages,
        }
    }
}

#[derive(Serialize)]
struct AdaptiveMix {
    lz4_pages: u64,
    zstd_pages: u64,
    raw_pages: u64,
    lz4_percent: Option<f64>,
    zstd_percent: Option<f64>,
    dual_layer_extra_vs_zstd_percent: Option<f64>,
}

#[derive(Serialize)]
struct Figure2 {
    granularity: Granularity,
    input_sizes: Vec<InputSize>,
    algorithms: AlgorithmsAtPage,
}

#[derive(Serialize)]
struct Granularity {
    input_bytes: usize,
    byte_bytes: u64,
    byte_ratio: Option<f64>,
    block_4k_bytes: u64,
    block_4k_ratio: Option<f64>,
    block_4k_extra_percent: Option<f64>,
}

#[derive(Serialize)]
struct InputSize {
    input_bytes: usize,
    compressed_bytes: u64,
    ratio: Option<f64>,
}

#[derive(Serialize)]
struct AlgorithmsAtPage {
    input_bytes: usize,
    lz4_bytes: u64,
    lz4_ratio: Option<f64>,
    zstd_bytes: u64,
    zstd_ratio: Option<f64>,
    deflate_bytes: u64,
    deflate_ratio: Option<f64>,
}

#[derive(Serialize)]
struct Figure5c {
    software_percent: Option<f64>,
    software_4k_percent: Option<f64>,
    dual_layer_percent: Option<f64>,
}

#[derive(Serialize)]
struct SelectorJson {
    threshold_bytes_per_us: f64,
    /// The tie rule's rate above the drive; null for the paper's rule.
    tie_bytes_per_us: Option<f64>,
    cpu_busy_fraction: f64,
    first_write: bool,
    decompress_cost: CostJson,
}

#[derive(Serialize)]
struct CostJson {
    lz4: LineJson,
    zstd: LineJson,
}

#[derive(Serialize)]
struct LineJson {
    fixed_us: f64,
    us_per_kib: f64,
}

impl From<LinearCost> for LineJson {
    fn from(line: LinearCost) -> LineJson {
        LineJson { fixed_us: line.fixed_us, us_per_kib: line.us_per_byte * 1024.0 }
    }
}

impl Report {
    pub fn new(input: &Input, totals: &Totals) -> Report {
        let logical = totals.pages * input.page_size.bytes() as u64;
        let cost = input.selector.cost();
        Report {
            files: input.files.iter().map(|(path, bytes)| FileJson { path: path.clone(), bytes: *bytes }).collect(),
            page_size: input.page_size.bytes(),
            pages: totals.pages,
            logical_bytes: logical,
            zero_pages: totals.zero_pages,
            zstd_level: input.zstd_level,
            deflate_level: input.deflate_level,
            drive_only_bytes: totals.drive_only,
            drive_only_ratio: ratio(logical, totals.drive_only),
            algorithms: Algorithms {
                lz4: AlgorithmJson::new(logical, &totals.lz4),
                zstd: AlgorithmJson::new(logical, &totals.zstd),
                adaptive: AlgorithmJson::new(logical, &totals.adaptive),
            },
            adaptive_mix: adaptive_mix(totals),
            figure2: figure2(input, totals, logical),
            figure5c: Figure5c {
                software_percent: extra_percent(totals.lz4.software, totals.zstd.software),
                software_4k_percent: extra_percent(totals.lz4.software_4k, totals.zstd.software_4k),
                dual_layer_percent: extra_percent(totals.lz4.dual_layer, totals.zstd.dual_layer),
            },
            selector: SelectorJson {
                threshold_bytes_per_us: input.selector.config().threshold_bytes_per_us,
                tie_bytes_per_us: input.selector.config().tie_bytes_per_us,
                cpu_busy_fraction: 0.0,
                first_write: true,
                decompress_cost: CostJson { lz4: cost.lz4.into(), zstd: cost.zstd.into() },
            },
        }
    }
}

fn adaptive_mix(totals: &Totals) -> AdaptiveMix {
    let compressed = totals.adaptive_lz4_pages + totals.adaptive_zstd_pages;
    AdaptiveMix {
        lz4_pages: totals.adaptive_lz4_pages,
        zstd_pages: totals.adaptive_zstd_pages,
        raw_pages: totals.adaptive_raw_pages,
        lz4_percent: share_percent(totals.adaptive_lz4_pages, compressed),
        zstd_percent: share_percent(totals.adaptive_zstd_pages, compressed),
        dual_layer_extra_vs_zstd_percent: extra_percent(totals.adaptive.dual_layer, totals.zstd.dual_layer),
    }
}

fn figure2(input: &Input, totals: &Totals, logical: u64) -> Figure2 {
    let at = |size: usize| totals.inputs[INPUT_SIZES.iter().position(|&s| s == size).expect("a measured input size")];
    let granularity = at(GRANULARITY_INPUT);
    Figure2 {
        granularity: Granularity {
            input_bytes: GRANULARITY_INPUT,
            byte_bytes: granularity.byte_granular,
            byte_ratio: ratio(logical, granularity.byte_granular),
            block_4k_bytes: granularity.block_4k,
            block_4k_ratio: ratio(logical, granularity.block_4k),
            block_4k_extra_percent: extra_percent(granularity.block_4k, granularity.byte_granular),
        },
        input_sizes: INPUT_SIZES
            .iter()
            .zip(&totals.inputs)
            .map(|(&input_bytes, counted)| InputSize {
                input_bytes,
                compressed_bytes: counted.byte_granular,
                ratio: ratio(logical, counted.byte_granular),
            })
            .collect(),
        algorithms: AlgorithmsAtPage {
            input_bytes: input.page_size.bytes(),
            lz4_bytes: totals.lz4.software,
            lz4_ratio: ratio(logical, totals.lz4.software),
            zstd_bytes: totals.zstd.software,
            zstd_ratio: ratio(logical, totals.zstd.software),
            deflate_bytes: totals.deflate_page,
            deflate_ratio: ratio(logical, totals.deflate_page),
        },
    }
}

/// `1234567` as `1,234,567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn show_ratio(ratio: Option<f64>) -> String {
    ratio.map_or_else(|| "-".to_string(), |r| format!("{r:.3}"))
}

fn show_percent(percent: Option<f64>) -> String {
    percent.map_or_else(|| "-".to_string(), |p| format!("{p:.1}%"))
}

fn show_input(bytes: usize) -> String {
    if bytes >= 1 << 20 { format!("{} MiB", bytes >> 20) } else { format!("{} KiB", bytes >> 10) }
}

impl Report {
    /// The report as Markdown for people: every number of the JSON, in tables.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        self.write_header(&mut out);
        self.write_layers(&mut out);
        self.write_mix(&mut out);
        self.write_figure5c(&mut out);
        self.write_figure2(&mut out);
        out
    }

    fn write_header(&self, out: &mut String) {
        let names: Vec<&str> = self.files.iter().map(|f| f.path.as_str()).collect();
        let page_kib = self.page_size >> 10;
        let cost = &self.selector.decompress_cost;
        let _ = writeln!(out, "# tundra analyze: {}\n", names.join(", "));
        for file in &self.files {
            let _ = writeln!(out, "- file `{}`: {} bytes", file.path, thousands(file.bytes));
        }
        let _ = writeln!(
            out,
            "- {} pages of {page_kib} KiB, {} logical bytes (each file's last partial page zero-padded), {} all zeros",
            thousands(self.pages),
            thousands(self.logical_bytes),
            thousands(self.zero_pages)
        );
        let _ = writeln!(
            out,
            "- software layer: lz4, zstd level {}; a page that saves no 4 KiB block is stored raw",
            self.zstd_level
        );
        let _ = writeln!(
            out,
            "- drive layer: the emulated drive, raw deflate level {} per 4 KiB block in 16-byte units, all-zero blocks free",
            self.deflate_level
        );
        let _ = writeln!(
            out,
            "- adaptive: Algorithm 1 (seed 000 §3.3.2) at {} B/µs, {}, on an idle host, every page a first write; \
             decompression calibrated on this machine: lz4 {:.2} µs + {:.3} µs/KiB, zstd {:.2} µs + {:.3} µs/KiB\n",
            self.selector.threshold_bytes_per_us,
            match self.selector.tie_bytes_per_us {
                Some(rate) => format!("block ties decided at {rate} B/µs of byte-granular saving"),
                None => "block ties to lz4 (the paper's rule)".to_string(),
            },
            cost.lz4.fixed_us,
            cost.lz4.us_per_kib,
            cost.zstd.fixed_us,
            cost.zstd.us_per_kib
        );
    }

    fn write_layers(&self, out: &mut String) {
        let _ = writeln!(out, "## What each layout stores (seed 000 Figure 14)\n");
        let _ = writeln!(
            out,
            "| layout | software bytes | software 4 KiB bytes | software 4 KiB ratio | stored bytes | ratio | raw pages |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|");
        let _ = writeln!(
            out,
            "| drive only | | | | {} | {} | |",
            thousands(self.drive_only_bytes),
            show_ratio(self.drive_only_ratio)
        );
        let a = &self.algorithms;
        for (name, algorithm) in [("lz4 + drive", &a.lz4), ("zstd + drive", &a.zstd), ("adaptive + drive", &a.adaptive)]
        {
            let _ = writeln!(
                out,
                "| {name} | {} | {} | {} | {} | {} | {} |",
                thousands(algorithm.software_bytes),
                thousands(algorithm.software_4k_bytes),
                show_ratio(algorithm.software_4k_ratio),
                thousands(algorithm.dual_layer_bytes),
                show_ratio(algorithm.dual_layer_ratio),
                thousands(algorithm.raw_pages)
            );
        }
        let _ = writeln!(
            out,
            "\nSoftware bytes are byte-granular (each page capped at the page size); 4 KiB bytes round each \
             page up to whole blocks; stored bytes are what the drive keeps of those blocks.\n"
        );
    }

    fn write_mix(&self, out: &mut String) {
        let m = &self.adaptive_mix;
        let _ = writeln!(out, "## Algorithm 1's choices (seed 000 Table 3)\n");
        let _ = writeln!(out, "| stored as | pages | share of compressed pages |");
        let _ = writeln!(out, "|---|---:|---:|");
        let _ = writeln!(out, "| zstd | {} | {} |", thousands(m.zstd_pages), show_percent(m.zstd_percent));
        let _ = writeln!(out, "| lz4 | {} | {} |", thousands(m.lz4_pages), show_percent(m.lz4_percent));
        let _ = writeln!(out, "| raw (no block saved) | {} | |", thousands(m.raw_pages));
        let _ = writeln!(
            out,
            "\nAfter both layers, adaptive stores {} more than zstd alone (seed 000 Figure 14: 0.7% to 2.6%).\n",
            show_percent(m.dual_layer_extra_vs_zstd_percent)
        );
    }

    fn write_figure5c(&self, out: &mut String) {
        let (lz4, zstd, f) = (&self.algorithms.lz4, &self.algorithms.zstd, &self.figure5c);
        let _ = writeln!(out, "## zstd's advantage over lz4 (seed 000 Figure 5c)\n");
        let _ = writeln!(out, "| layer | lz4 bytes | zstd bytes | lz4 stores more by | seed 000 |");
        let _ = writeln!(out, "|---|---:|---:|---:|---:|");
        let rows = [
            ("software, byte-granular", lz4.software_bytes, zstd.software_bytes, f.software_percent, "58.9%"),
            ("software, 4 KiB blocks", lz4.software_4k_bytes, zstd.software_4k_bytes, f.software_4k_percent, ""),
            ("after the drive", lz4.dual_layer_bytes, zstd.dual_layer_bytes, f.dual_layer_percent, "9.0%"),
        ];
        for (layer, lz4_bytes, zstd_bytes, percent, paper) in rows {
            let _ = writeln!(
                out,
                "| {layer} | {} | {} | {} | {paper} |",
                thousands(lz4_bytes),
                thousands(zstd_bytes),
                show_percent(percent)
            );
        }
        out.push('\n');
    }

    fn write_figure2(&self, out: &mut String) {
        let f = &self.figure2;
        let g = &f.granularity;
        let _ = writeln!(out, "## Seed 000 Figure 2 on this data\n");
        let _ = writeln!(
            out,
            "(a) Index granularity, zstd level {} on {} inputs:\n",
            self.zstd_level,
            show_input(g.input_bytes)
        );
        let _ = writeln!(out, "| granularity | bytes | ratio |\n|---|---:|---:|");
        let _ = writeln!(out, "| byte | {} | {} |", thousands(g.byte_bytes), show_ratio(g.byte_ratio));
        let _ = writeln!(out, "| 4 KiB | {} | {} |", thousands(g.block_4k_bytes), show_ratio(g.block_4k_ratio));
        let _ = writeln!(
            out,
            "\n4 KiB granularity stores {} more (seed 000: 80.5%).\n",
            show_percent(g.block_4k_extra_percent)
        );
        let _ = writeln!(out, "(b) Input size, zstd level {}, byte granularity:\n", self.zstd_level);
        let _ = writeln!(out, "| input | bytes | ratio |\n|---|---:|---:|");
        for input in &f.input_sizes {
            let _ = writeln!(
                out,
                "| {} | {} | {} |",
                show_input(input.input_bytes),
                thousands(input.compressed_bytes),
                show_ratio(input.ratio)
            );
        }
        let a = &f.algorithms;
        let _ = writeln!(out, "\n(c) Algorithm on {} pages, byte granularity:\n", show_input(a.input_bytes));
        let _ = writeln!(out, "| algorithm | bytes | ratio |\n|---|---:|---:|");
        let _ = writeln!(out, "| lz4 | {} | {} |", thousands(a.lz4_bytes), show_ratio(a.lz4_ratio));
        let _ = writeln!(
            out,
            "| zstd level {} | {} | {} |",
            self.zstd_level,
            thousands(a.zstd_bytes),
            show_ratio(a.zstd_ratio)
        );
        let _ = writeln!(
            out,
            "| deflate level {} | {} | {} |",
            self.deflate_level,
            thousands(a.deflate_bytes),
            show_ratio(a.deflate_ratio)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_for_people() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(47_357_952), "47,357,952");
        assert_eq!(ratio(10, 0), None);
        assert_eq!(extra_percent(150, 100), Some(50.0));
        assert_eq!(show_input(1 << 20), "1 MiB");
        assert_eq!(show_input(16 << 10), "16 KiB");
    }
}
