//! `tundra kv bench` against `tundra serve` as a process: the reference compute node sends redo
//! and reads pages at its readers' LSNs over the native protocol; every read must match the
//! committed data at its reader's LSN. After a SIGKILL of the node, the volume's redo stream is
//! durable through the last acknowledged commit, and the node serves a new run.

#[allow(dead_code)]
mod common;
#[allow(dead_code)]
#[path = "common/serve.rs"]
mod common_serve;

use common::succeeds;
use common_serve::*;

fn bench(node: &Node, volume: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["kv", "bench", "--volume", volume, "--size", "32MiB", "--json"];
    args.extend_from_slice(extra);
    let out = succeeds(&node.with_addr(&args));
    serde_json::from_slice(&out.stdout).expect("kv bench --json is JSON")
}

fn redo_durable_lsn(node: &Node, volume: &str) -> u64 {
    let out = succeeds(&node.with_addr(&["stats", "--json"]));
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stats --json is JSON");
    let entry = stats["volumes"].as_array().and_then(|v| v.iter().find(|v| v["name"] == volume)).cloned();
    entry.and_then(|v| v["redo"]["durable_lsn"].as_u64()).unwrap_or_else(|| panic!("no redo stats for {volume}"))
}

#[test]
fn the_kv_bench_finds_no_mismatch_and_survives_a_kill() {
    let site = Site::new();
    let node = site.start();
    let report = bench(&node, "kv", &["--transactions", "300", "--keys", "3000", "--restart-every", "100"]);
    assert_eq!(report["mismatches"], 0, "{report}");
    assert!(report["commits"].as_u64().unwrap() >= 300, "{report}");
    assert!(report["reads_checked"].as_u64().unwrap() > 1_000, "{report}");
    assert_eq!(report["rw_restarts"], 3, "{report}");
    let acknowledged = report["final_lsn"].as_u64().unwrap();
    assert_eq!(redo_durable_lsn(&node, "kv"), acknowledged);
    node.kill9();

    let node = site.start();
    assert_eq!(redo_durable_lsn(&node, "kv"), acknowledged, "every acknowledged commit survives the kill");
    let report = bench(&node, "kv2", &["--transactions", "100", "--keys", "1000"]);
    assert_eq!(report["mismatches"], 0, "{report}");
    node.stop();
}
