//! `tundra bench hashkv` at a tiny size, so the benchmark cannot rot: the default build has no
//! RocksDB, so this runs the hash KV store alone and checks the report says so.

mod common;

use common::{fails, succeeds};

#[test]
fn a_tiny_run_reports_the_hash_kv_and_names_the_missing_peer() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("bench");
    let args = [
        "bench",
        "hashkv",
        "--keys",
        "3000",
        "--clients",
        "2,4",
        "--repetitions",
        "2",
        "--warmup-seconds",
        "0.05",
        "--window-seconds",
        "0.2",
        "--sections",
        "2",
        "--json",
        "--dir",
        work.to_str().unwrap(),
    ];
    let out = succeeds(&args);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(report["rocksdb_built"], false);
    assert!(stderr.contains("was not built") && stderr.contains("scripts/bench-hashkv"), "{stderr}");
    assert!(report["rocksdb_ops_per_s"].is_null());
    assert!(report["rocksdb_physical_bytes"].is_null());
    assert!(report["hashkv_ops_per_s"].as_f64().unwrap() > 0.0);
    assert!(report["hashkv_cpu_us_per_op"].as_f64().unwrap() > 0.0);
    // 3000 records of 419 bytes, half of each value random: physically about 0.7 MB, while
    // the sparse table maps several times that logically.
    let physical = report["hashkv_physical_bytes"].as_u64().unwrap();
    let mapped = report["hashkv_mapped_bytes"].as_u64().unwrap();
    assert!(physical > 3000 * 200 && physical < 3000 * 419, "physical {physical}");
    assert!(mapped > 2 * physical, "mapped {mapped}, physical {physical}");
    assert_eq!(report["runs"].as_array().unwrap().len(), 4, "two client counts, two repetitions each");
    assert_eq!(report["headline_clients"], 4);
    assert!(!work.exists(), "the working directory is removed without --keep");
}

#[test]
fn bad_arguments_are_refused() {
    fails(&["bench", "hashkv", "--keys", "0"], "must be positive");
    fails(&["bench", "hashkv", "--clients", "0"], "must be positive");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("stray"), b"x").unwrap();
    fails(&["bench", "hashkv", "--dir", dir.path().to_str().unwrap()], "not empty");
}
