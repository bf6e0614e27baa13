//! `tundra-bench redo` end to end at a tiny size, so the redo commit benchmark cannot rot.

mod common;

use common::{fails, succeeds};

#[test]
fn a_tiny_run_reports_every_method_against_the_baseline() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("redo.json");
    let out = succeeds(&[
        "redo",
        "--commits",
        "20",
        "--runs",
        "2",
        "--batch-bytes",
        "512,16KiB",
        "--ring",
        "1MiB",
        "--dir",
        dir.path().to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    let out = String::from_utf8(out.stdout).expect("utf-8 output");
    assert!(out.contains("configuration: `tundra-bench redo --commits 20"), "{out}");
    assert!(out.contains("| redo_log_zstd |"), "{out}");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["commits"], 20);
    assert_eq!(report["runs"], 2);
    assert!(!report["storage"]["filesystem"].as_str().unwrap().is_empty(), "{report}");
    let sizes = report["sizes"].as_array().unwrap();
    assert_eq!(sizes.iter().map(|s| s["batch_bytes"].as_u64().unwrap()).collect::<Vec<_>>(), [512, 16384]);
    for size in sizes {
        let methods = size["methods"].as_array().unwrap();
        let names: Vec<&str> = methods.iter().map(|m| m["method"].as_str().unwrap()).collect();
        assert_eq!(names, ["fdatasync", "fdatasync_direct", "redo_log", "redo_log_zstd"]);
        assert_eq!(methods[0]["ratio_p50"], 1.0, "the baseline against itself");
        for method in methods {
            assert_eq!(method["runs"].as_array().unwrap().len(), 2);
            let p50 = method["latency_us_p50"].as_f64().unwrap();
            assert!(p50 > 0.0 && p50 <= method["latency_us_p99"].as_f64().unwrap(), "{method}");
            // Every commit reaches the device in whole 4 KiB blocks, at least one.
            let device = method["device_bytes_per_commit"].as_f64().unwrap();
            assert!(device >= 4096.0, "{method}");
        }
        // The same batch bytes for the baselines and the redo log; fewer once compressed.
        let payload = |m: usize| methods[m]["payload_bytes_per_commit"].as_f64().unwrap();
        assert_eq!(payload(0), size["batch_bytes"].as_f64().unwrap());
        assert_eq!(payload(1), payload(0));
        assert_eq!(payload(2), payload(0));
        // Whole blocks: the direct baseline writes at least the pages the plain one dirties, and
        // the redo log at least as many blocks as the direct baseline (its headers take room).
        let device = |m: usize| methods[m]["device_bytes_per_commit"].as_f64().unwrap();
        assert!(device(1) >= device(0) && device(2) >= device(1), "{size}");
        assert!(size["zstd_ratio"].as_f64().unwrap() > 1.0, "{size}");
    }
    // Text-like redo compresses at 16 KiB, so the compressed log writes fewer bytes there.
    let big = &sizes[1]["methods"];
    assert!(big[3]["payload_bytes_per_commit"].as_f64() < big[2]["payload_bytes_per_commit"].as_f64());
    // The scratch files are gone; the given directory stays with the JSON in it.
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, [std::ffi::OsString::from("redo.json")]);
}

#[test]
fn a_tiny_run_with_a_node_adds_the_protocol_method() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("redo.json");
    let dir_arg = dir.path().to_str().unwrap();
    let args = ["redo", "--commits", "10", "--runs", "1", "--batch-bytes", "4KiB", "--ring", "1MiB", "--node"];
    let out = succeeds(&[&args[..], &["--dir", dir_arg, "--json", json.to_str().unwrap()]].concat());
    let out = String::from_utf8(out.stdout).expect("utf-8 output");
    assert!(out.contains("--ring 1MiB --node`"), "{out}");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let methods = report["sizes"][0]["methods"].as_array().unwrap();
    let names: Vec<&str> = methods.iter().map(|m| m["method"].as_str().unwrap()).collect();
    assert_eq!(names, ["fdatasync", "fdatasync_direct", "redo_log", "redo_log_zstd", "node_protocol"]);
    // The node's devices are its own: their bytes are not counted.
    assert!(methods[4]["device_bytes_per_commit"].is_null(), "{}", methods[4]);
    assert_eq!(methods[4]["payload_bytes_per_commit"], 4096.0);
    assert!(methods[4]["latency_us_p50"].as_f64().unwrap() > 0.0);
}

#[test]
fn bad_sizes_are_refused() {
    fails(&["redo", "--batch-bytes", "16"], "--batch-bytes 16: a batch takes from");
    fails(&["redo", "--page-size", "3000"], "--page-size must be a power of two");
    fails(&["redo", "--ring", "64KiB"], "--ring must be a multiple of 4KiB of at least 1MiB");
    fails(&["redo", "--commits", "0"], "--commits and --runs must be at least 1");
}
