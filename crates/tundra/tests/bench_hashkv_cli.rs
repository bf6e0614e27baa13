//! `tundra bench hashkv` at a tiny size, so the benchmark cannot rot: the default build has no
//! RocksDB, so this runs the hash KV store alone and checks the report says so. Built with the
//! `rocksdb` feature (`cargo test -p tundra --features rocksdb --test bench_hashkv_cli`), a
//! tiny run with the peer on its emulated drive is checked too (it needs root and /dev/fuse).

mod common;

use common::{fails, succeeds};

#[cfg(not(feature = "rocksdb"))]
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

#[cfg(feature = "rocksdb")]
#[test]
fn a_tiny_run_measures_rocksdb_on_its_drive_alike() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !std::path::Path::new("/dev/fuse").exists() {
        eprintln!("skipped: RocksDB's drive needs root and /dev/fuse (FUSE, losetup, mount)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("bench");
    let args = [
        "bench",
        "hashkv",
        "--keys",
        "3000",
        "--clients",
        "2",
        "--repetitions",
        "1",
        "--warmup-seconds",
        "0.05",
        "--window-seconds",
        "0.3",
        "--sections",
        "2",
        "--json",
        "--dir",
        work.to_str().unwrap(),
    ];
    let out = succeeds(&args);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    assert_eq!(report["rocksdb_built"], true);
    for store in ["hashkv", "rocksdb"] {
        let figure = |name: &str| report[format!("{store}_{name}")].as_f64().unwrap_or(-1.0);
        assert!(figure("ops_per_s") > 0.0, "{store}: {report}");
        assert!(figure("drive_cpu_us_per_op") > 0.0, "{store} pays its drive's CPU: {report}");
        assert!(figure("drive_codec_cpu_us_per_op") <= figure("drive_cpu_us_per_op") + 1.0, "{report}");
        assert!(figure("host_cpu_us_per_op") > 0.0, "{report}");
        assert!(figure("physical_bytes") > 0.0 && figure("physical_peak_bytes") > 0.0, "{report}");
    }
    assert!(report["host_cpu_ratio"].as_f64().unwrap() > 0.0);
    assert!(!work.exists(), "the drive is taken down and the directory removed");
}

#[test]
fn bad_arguments_are_refused() {
    fails(&["bench", "hashkv", "--keys", "0"], "must be positive");
    fails(&["bench", "hashkv", "--clients", "0"], "must be positive");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("stray"), b"x").unwrap();
    fails(&["bench", "hashkv", "--dir", dir.path().to_str().unwrap()], "not empty");
}
