//! End-to-end tests of `tundra analyze` as a user runs it: the binary on a generated file, its
//! JSON keys and the relations its numbers must keep, and its errors. Generated data checks
//! plumbing only; ratios are claimed on real data (docs/measurements.md).

use std::path::Path;
mod common;

use common::{fails, succeeds, tundra};

use serde_json::Value;
use tundra_env::Rng;

fn ok(args: &[&str]) -> String {
    let out = succeeds(args);
    // Progress goes to a terminal only; a pipe gets nothing on standard error.
    assert!(out.stderr.is_empty(), "unexpected stderr: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// CSV-like rows of flights: text that compresses several times over.
fn text(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut data = Vec::with_capacity(len + 64);
    let mut row = 0;
    while data.len() < len {
        let r = rng.next_u64();
        let line =
            format!("{row:07},2013-01-{:02},UA,N{:05},EWR,IAH,{}\n", 1 + r % 28, (r >> 8) % 99_991, (r >> 32) % 1440);
        data.extend_from_slice(line.as_bytes());
        row += 1;
    }
    data.truncate(len);
    data
}

fn random(len: usize, seed: u64) -> Vec<u8> {
    Rng::new(seed).bytes(len)
}

/// 2 MiB of text with a 64 KiB stretch of random bytes every 256 KiB, and a partial last page.
fn mixed_file(path: &Path) -> usize {
    let mut data = Vec::new();
    for i in 0..8 {
        data.extend_from_slice(&text(192 << 10, i));
        data.extend_from_slice(&random(64 << 10, i + 100));
    }
    data.extend_from_slice(&text(5000, 99));
    std::fs::write(path, &data).unwrap();
    data.len()
}

fn analyze_json(args: &[&str]) -> Value {
    let mut all = vec!["analyze", "--json"];
    all.extend_from_slice(args);
    serde_json::from_str(&ok(&all)).expect("analyze JSON")
}

fn number(value: &Value, key: &str) -> f64 {
    value[key].as_f64().unwrap_or_else(|| panic!("{key} is not a number in {value}"))
}

#[test]
fn mixed_file_reports_every_layer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("table.db");
    let len = mixed_file(&path);
    let report = analyze_json(&[path.to_str().unwrap()]);

    let pages = len.div_ceil(16384) as u64;
    assert_eq!(report["page_size"], 16384);
    assert_eq!(report["pages"], pages);
    assert_eq!(report["logical_bytes"], pages * 16384);
    assert_eq!(report["files"][0]["bytes"], len as u64);
    let drive_only = number(&report, "drive_only_ratio");
    assert!(drive_only >= 1.0);
    for name in ["lz4", "zstd", "adaptive"] {
        let algorithm = &report["algorithms"][name];
        let software_4k = number(algorithm, "software_4k_ratio");
        let dual = number(algorithm, "dual_layer_ratio");
        assert!(software_4k >= 1.0 && number(algorithm, "software_ratio") >= software_4k, "{name}: {algorithm}");
        assert!(dual >= software_4k, "{name}: the drive never stores more than the blocks it is given: {algorithm}");
        // 32 of the pages are pure random bytes, which no algorithm saves a block on.
        assert!(algorithm["raw_pages"].as_u64().unwrap() >= 32, "{name}: {algorithm}");
    }
    let lz4 = &report["algorithms"]["lz4"];
    let zstd = &report["algorithms"]["zstd"];
    assert!(number(zstd, "software_ratio") > number(lz4, "software_ratio"), "zstd has entropy coding");
    assert!(number(zstd, "dual_layer_ratio") >= number(lz4, "dual_layer_ratio"));

    let mix = &report["adaptive_mix"];
    let mixed_pages = ["lz4_pages", "zstd_pages", "raw_pages"].iter().map(|k| mix[*k].as_u64().unwrap()).sum::<u64>();
    assert_eq!(mixed_pages, pages);
    let figure2 = &report["figure2"];
    assert_eq!(figure2["input_sizes"].as_array().unwrap().len(), 6);
    assert!(number(&figure2["granularity"], "byte_ratio") >= number(&figure2["granularity"], "block_4k_ratio"));
    for key in ["lz4_ratio", "zstd_ratio", "deflate_ratio"] {
        assert!(number(&figure2["algorithms"], key) >= 1.0);
    }
    for key in ["software_percent", "software_4k_percent", "dual_layer_percent"] {
        assert!(report["figure5c"][key].is_number(), "figure5c lacks {key}");
    }
    for algorithm in ["lz4", "zstd"] {
        assert!(report["selector"]["decompress_cost"][algorithm]["fixed_us"].is_number());
    }
}

#[test]
fn on_compressible_text_both_layers_beat_the_drive_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("text.db");
    std::fs::write(&path, text(1 << 20, 7)).unwrap();
    for page_size in ["8KiB", "16KiB"] {
        let report = analyze_json(&[path.to_str().unwrap(), "--page-size", page_size]);
        let drive_only = number(&report, "drive_only_ratio");
        let zstd = number(&report["algorithms"]["zstd"], "dual_layer_ratio");
        assert!(zstd >= drive_only, "{page_size}: zstd + drive {zstd} vs drive only {drive_only}");
    }
}

#[test]
fn incompressible_and_empty_pages() {
    let dir = tempfile::tempdir().unwrap();
    let random_path = dir.path().join("random.db");
    std::fs::write(&random_path, random(256 << 10, 5)).unwrap();
    let report = analyze_json(&[random_path.to_str().unwrap()]);
    assert_eq!(report["adaptive_mix"]["raw_pages"], 16, "{report}");
    for name in ["lz4", "zstd", "adaptive"] {
        assert_eq!(report["algorithms"][name]["software_4k_ratio"], 1.0);
    }
    // The drive stores nothing for zeros: every ratio over the drive alone has no value.
    let zeros_path = dir.path().join("zeros.db");
    std::fs::write(&zeros_path, vec![0u8; 64 << 10]).unwrap();
    let report = analyze_json(&[zeros_path.to_str().unwrap()]);
    assert_eq!(report["zero_pages"], 4);
    assert_eq!(report["drive_only_bytes"], 0);
    assert!(report["drive_only_ratio"].is_null(), "{report}");
    assert!(ok(&["analyze", zeros_path.to_str().unwrap()]).contains("| drive only | | | | 0 | - | |"));
}

#[test]
fn markdown_names_the_files_and_pages() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.db");
    let b = dir.path().join("b.db");
    std::fs::write(&a, text(100_000, 1)).unwrap();
    std::fs::write(&b, text(8192, 2)).unwrap();
    let out = ok(&["analyze", a.to_str().unwrap(), b.to_str().unwrap(), "--page-size", "8KiB"]);
    // 13 pages of the first file (the last one padded) and 1 of the second.
    assert!(out.contains("14 pages of 8 KiB"), "{out}");
    assert!(out.contains("a.db") && out.contains("b.db"), "{out}");
    for heading in ["Figure 14", "Table 3", "Figure 5c", "Figure 2"] {
        assert!(out.contains(heading), "no {heading} in {out}");
    }
}

#[test]
fn bad_input_gets_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.db");
    fails(&["analyze", missing.to_str().unwrap()], "missing.db");
    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").unwrap();
    fails(&["analyze", empty.to_str().unwrap()], "no pages to analyze");
    let data = dir.path().join("data.db");
    std::fs::write(&data, text(20_000, 3)).unwrap();
    fails(&["analyze", data.to_str().unwrap(), "--page-size", "4KiB"], "only pages of 8KiB or 16KiB");
    fails(&["analyze", data.to_str().unwrap(), "--page-size", "big"], "--page-size big");
    fails(&["analyze", dir.path().to_str().unwrap()], "not a regular file");
    let out = tundra(&["analyze"]);
    assert_eq!(out.status.code(), Some(2), "a missing argument is a usage error");
}
