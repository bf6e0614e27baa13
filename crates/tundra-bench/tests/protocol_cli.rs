//! `tundra-bench protocol` end to end at a tiny size, so the benchmark cannot rot.

mod common;

use common::{fails, succeeds};

#[test]
fn protocol_bench_measures_a_real_node_against_in_process_calls() {
    let out = succeeds(&["protocol", "--ops", "40", "--queue-depth", "4", "--pages", "64", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["page_size"], 8192);
    assert_eq!(report["ops"], 40);
    for phase in ["in_process", "protocol_qd1", "protocol_qdn"] {
        for kind in ["read", "write"] {
            let stats = &report[phase][kind];
            assert_eq!(stats["ops"], 40, "{phase} {kind}: {stats}");
            let median = stats["latency_us_median"].as_f64().unwrap();
            assert!(median > 0.0 && median.is_finite(), "{phase} {kind}: {stats}");
        }
    }
    assert_eq!(report["protocol_qdn"]["queue_depth"], 4);
    for kind in ["read", "write"] {
        let ratio = report[kind]["qd1_ratio_median"].as_f64().unwrap();
        assert!(ratio > 0.0 && ratio.is_finite(), "{kind}: {}", report[kind]);
    }
}

#[test]
fn protocol_bench_rejects_bad_arguments() {
    fails(&["protocol", "--page-size", "4KiB"], "8KiB or 16KiB");
    fails(&["protocol", "--ops", "0"], "at least 1");
    let dir = tempfile::tempdir().unwrap();
    fails(&["protocol", "--data-dir", dir.path().to_str().unwrap()], "exists");
}
