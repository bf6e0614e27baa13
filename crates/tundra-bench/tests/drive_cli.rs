//! `tundra-bench drive` end to end at its quick size, so the drive benchmark cannot rot.

mod common;

use common::{fails, succeeds};

#[test]
fn quick_run_reports_ratios_and_garbage_collection() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let out = succeeds(&["drive", "--quick", "--dir", dir.path().to_str().unwrap(), "--json", json.to_str().unwrap()]);
    let out = String::from_utf8(out.stdout).expect("utf-8 output");
    assert!(out.contains("configuration: `tundra-bench drive"), "{out}");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let latency = report["latency"].as_array().unwrap();
    assert_eq!(latency.len(), 4);
    // Data of a higher target ratio compresses more, and the map costs 7 bytes per LBA.
    let achieved: Vec<f64> = latency.iter().map(|p| p["achieved_ratio"].as_f64().unwrap()).collect();
    assert!(achieved.windows(2).all(|w| w[0] < w[1]), "{achieved:?}");
    assert!((achieved[0] - 1.0).abs() < 0.05 && achieved[1] > 1.7, "{achieved:?}");
    assert!(latency.iter().all(|p| p["map_bytes_per_lba"].as_f64().unwrap() <= 8.0));
    let gc = report["gc"].as_array().unwrap();
    assert_eq!(gc.len(), 6);
    for point in gc {
        let wa = point["gc_write_amplification"].as_f64().unwrap();
        assert!(wa >= 1.0, "{point}");
    }
}

#[test]
fn unknown_suite_is_refused() {
    fails(&["drive", "--quick", "--suite", "everything"], "--suite is latency, gc or all");
}
