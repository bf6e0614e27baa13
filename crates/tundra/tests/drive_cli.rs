//! End-to-end tests of `tundra drive ...` as a user runs it: the binary, real files, JSON output.

use std::path::Path;
mod common;

use common::{fails, succeeds};
use tundra_env::Rng;

fn ok(args: &[&str]) -> String {
    let out = succeeds(args);
    String::from_utf8(out.stdout).expect("utf-8 output")
}

fn stats(image: &Path) -> serde_json::Value {
    serde_json::from_str(&ok(&["drive", "stats", image.to_str().unwrap(), "--json"])).expect("stats JSON")
}

/// Text-like content that compresses, with a tail that is not a whole block.
fn sample_file(path: &Path) -> Vec<u8> {
    let mut data = Vec::new();
    for i in 0..40_000u32 {
        data.extend_from_slice(
            format!("{i:08},2013-01-01,UA,N{:05},EWR,IAH,{}\n", i * 7 % 99_991, i % 1440).as_bytes(),
        );
    }
    data.truncate(data.len() - 123);
    std::fs::write(path, &data).unwrap();
    data
}

#[test]
fn format_load_dump_trim_collect() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("drive.img");
    let img = image.to_str().unwrap();
    ok(&["drive", "format", img, "--physical", "8MiB", "--logical", "32MiB", "--segment-size", "256KiB"]);
    let empty = stats(&image);
    assert_eq!(empty["logical_capacity_bytes"], 32 << 20);
    assert_eq!(empty["mapped_bytes"], 0);
    assert_eq!(empty["map_memory_bytes"], 7 * 8192);

    let source = dir.path().join("rows.csv");
    let data = sample_file(&source);
    ok(&["drive", "load", img, source.to_str().unwrap()]);
    let loaded = stats(&image);
    let blocks = (data.len() as u64).div_ceil(4096);
    assert_eq!(loaded["mapped_bytes"], blocks * 4096);
    let used = loaded["physical_used_bytes"].as_u64().unwrap();
    assert!(used > 0 && used * 2 < data.len() as u64, "text should compress more than 2x: {loaded}");
    for key in ["physical_capacity_bytes", "gc_moved_bytes", "compression_ratio", "physical_allocated_bytes"] {
        assert!(loaded.get(key).is_some(), "stats lacks {key}");
    }

    let dumped = dir.path().join("dump.csv");
    ok(&["drive", "dump", img, dumped.to_str().unwrap(), "--length", &data.len().to_string()]);
    assert_eq!(std::fs::read(&dumped).unwrap(), data, "dump must return what load wrote");

    ok(&["drive", "trim", img, "--offset", "0", "--length", "32MiB"]);
    ok(&["drive", "gc", img]);
    let trimmed = stats(&image);
    assert_eq!(trimmed["mapped_bytes"], 0);
    assert_eq!(trimmed["physical_used_bytes"], 0);
    let allocated = trimmed["physical_allocated_bytes"].as_u64().unwrap();
    assert!(allocated <= 2 * 256 * 1024, "after trim and GC at most the open segments stay allocated: {trimmed}");
    assert!(ok(&["drive", "stats", img]).contains("compression ratio"));
}

#[test]
fn bad_input_gets_clear_errors_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("drive.img");
    let img = image.to_str().unwrap();
    fails(&["drive", "stats", dir.path().join("missing.img").to_str().unwrap()], "missing.img");
    fails(&["drive", "format", img, "--physical", "8XB", "--logical", "32MiB"], "suffix");
    fails(&["drive", "format", img, "--physical", "8MiB", "--logical", "1000"], "multiple of 4 KiB");
    ok(&["drive", "format", img, "--physical", "1MiB", "--logical", "4MiB", "--segment-size", "64KiB"]);
    fails(&["drive", "format", img, "--physical", "1MiB", "--logical", "4MiB"], "drive.img");
    let before = stats(&image);
    let big = dir.path().join("big.bin");
    std::fs::write(&big, vec![1u8; 5 << 20]).unwrap();
    fails(&["drive", "load", img, big.to_str().unwrap()], "does not fit");
    fails(&["drive", "trim", img, "--offset", "100", "--length", "4096"], "multiple of 4096");
    fails(&["drive", "dump", img, dir.path().join("x").to_str().unwrap(), "--length", "8MiB"], "past");
    // Incompressible data beyond the physical capacity: drive full, and what was written stays.
    let random = dir.path().join("random.bin");
    let bytes = Rng::new(0x1234_5678).bytes(2 << 20);
    std::fs::write(&random, bytes).unwrap();
    fails(&["drive", "load", img, random.to_str().unwrap()], "drive full");
    let after = stats(&image);
    assert!(after["physical_live_bytes"].as_u64() <= after["physical_capacity_bytes"].as_u64());
    assert_eq!(before["logical_capacity_bytes"], after["logical_capacity_bytes"]);
    let not_a_drive = dir.path().join("plain.img");
    std::fs::write(&not_a_drive, vec![0u8; 1 << 20]).unwrap();
    fails(&["drive", "stats", not_a_drive.to_str().unwrap()], "not a formatted Tundra drive");
}
