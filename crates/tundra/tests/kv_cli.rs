//! `tundra kv bench` against `tundra serve` as a process: the reference compute node sends redo
//! and reads pages at its readers' LSNs over the native protocol; every read must match the
//! committed data at its reader's LSN. After a SIGKILL of the node, the volume's redo stream is
//! durable through the last acknowledged commit, and the node serves a new run. And a run rides
//! through the node killed and restarted under it: the commit in doubt is settled from the
//! durable LSN, and every read still matches.

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

#[test]
fn the_kv_bench_rides_through_the_node_killed_and_restarted_mid_run() {
    let site = Site::new();
    let node = site.start();
    let args = [
        "kv",
        "bench",
        "--volume",
        "kv",
        "--size",
        "32MiB",
        "--json",
        "--survive-restarts",
        "--transactions",
        "4000",
        "--keys",
        "3000",
        "--addr",
    ];
    let addr = node.native.to_string();
    let bench = std::process::Command::new(env!("CARGO_BIN_EXE_tundra"))
        .args(args)
        .arg(&addr)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run tundra kv bench");
    // Kill the node twice while the bench commits and reads, waiting until it has committed
    // something since the last start, so each kill lands mid-run.
    let mut node = node;
    for _ in 0..2 {
        let started = std::time::Instant::now();
        while redo_durable_lsn_or_zero(&node, "kv") < 20_000 && started.elapsed().as_secs() < 60 {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
        node.kill9_keep_ports();
        node = site.restart_on_same_ports(&node);
    }
    let out = bench.wait_with_output().expect("wait for the bench");
    assert!(out.status.success(), "the bench failed: {}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("kv bench --json is JSON");
    assert_eq!(report["mismatches"], 0, "{report}");
    // Each kill broke the bench's connection mid-run: it connected again after each.
    assert!(report["reconnects"].as_u64().unwrap() >= 2, "the kills landed mid-run: {report}");
    assert!(report["ro_resyncs"].as_u64().unwrap() >= 2, "the readers' leases died with the node: {report}");
    assert!(report["commits"].as_u64().unwrap() >= 4000, "{report}");
    assert_eq!(redo_durable_lsn(&node, "kv"), report["final_lsn"].as_u64().unwrap());
    node.stop();
}

fn redo_durable_lsn_or_zero(node: &Node, volume: &str) -> u64 {
    let out = common::tundra(&node.with_addr(&["stats", "--json"]));
    let Ok(stats) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else { return 0 };
    let entry = stats["volumes"].as_array().and_then(|v| v.iter().find(|v| v["name"] == volume)).cloned();
    entry.and_then(|v| v["redo"]["durable_lsn"].as_u64()).unwrap_or(0)
}
