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

#[test]
fn the_kv_bench_takes_a_mix_counts_ro_reads_and_shows_progress_on_a_terminal() {
    let site = Site::new();
    let node = site.start();
    // Ranges only on the readers, updates only on the writer.
    let mix = "point_select=0,range=1,update=1,insert=0,delete=0";
    let report = bench(&node, "mix", &["--transactions", "200", "--keys", "1000", "--mix", mix]);
    assert_eq!(report["mismatches"], 0, "{report}");
    assert_eq!(report["point_selects"], 0, "{report}");
    let ro_reads = report["ro_reads"].as_u64().unwrap();
    assert_eq!(ro_reads, report["range_scans"].as_u64().unwrap(), "{report}");
    assert!(ro_reads > 0 && ro_reads < report["reads_checked"].as_u64().unwrap(), "RW reads count too: {report}");
    // A mix that names no operation, or no reads, is refused before anything runs.
    for bad in ["select=3", "point_select=0,range=0", "update=x"] {
        let out = common::tundra(&node.with_addr(&["kv", "bench", "--volume", "bad", "--mix", bad]));
        assert!(!out.status.success(), "--mix {bad} was taken");
        assert!(String::from_utf8_lossy(&out.stderr).contains("--mix"), "{}", String::from_utf8_lossy(&out.stderr));
    }
    // Without --json: a progress line on stderr once a second, the result on stdout.
    let out =
        succeeds(&node.with_addr(&["kv", "bench", "--volume", "progress", "--transactions", "1500", "--keys", "2000"]));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let seconds: f64 =
        stdout.trim_end().rsplit(", ").next().and_then(|s| s.trim_end_matches(" s").parse().ok()).unwrap();
    if seconds >= 1.5 {
        assert!(stderr.contains("reads checked (") && stderr.contains("mismatches"), "{stderr}");
    }
    assert!(stdout.contains("reads checked") && stdout.contains("by RO nodes"), "{stdout}");
    node.stop();
}
