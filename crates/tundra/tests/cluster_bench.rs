//! Replication's costs, measured on real processes: page writes at queue depth 1 over the
//! native protocol to a node alone and to the leader of a three-node cluster on 127.0.0.1
//! (the ratio is what replication adds: a loopback round trip and a follower's log sync), and
//! the bytes the leader sends its two followers per page against the page's compressed size
//! (the leader compresses once and ships the compressed image: the target is at most 1.05x).
//!
//! By default it runs tiny (a few pages, one round) so that it cannot rot. With
//! `TUNDRA_CLUSTER_BENCH_OUT=DIR` it runs three rounds of `TUNDRA_CLUSTER_BENCH_PAGES` (default
//! 1,000) pages of a real PostgreSQL heap (`target/realdata/flights.heap` from
//! scripts/pg-real-table; the tundra binary's bytes if absent) and writes the raw figures,
//! each round's, their medians and spread, and the machine's load, to DIR/replication.txt.

mod common;
#[path = "common/cluster.rs"]
mod common_cluster;
#[path = "common/serve.rs"]
#[allow(dead_code)]
mod common_serve;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::succeeds;
use common_cluster::Cluster;
use tundra_proto::WriteMode;

const PAGE: usize = 8192;

fn pages(count: usize) -> (Vec<Vec<u8>>, &'static str) {
    let heap = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/realdata/flights.heap");
    let (bytes, what) = match std::fs::read(&heap) {
        Ok(bytes) if bytes.len() >= PAGE * 16 => (bytes, "flights.heap (PostgreSQL, nycflights13)"),
        _ => (std::fs::read(env!("CARGO_BIN_EXE_tundra")).expect("read the binary"), "the tundra binary"),
    };
    let available = bytes.len() / PAGE;
    ((0..count).map(|i| bytes[(i % available) * PAGE..(i % available + 1) * PAGE].to_vec()).collect(), what)
}

/// Writes every page at queue depth 1; returns each write's latency in microseconds.
fn write_all(client: &mut tundra_client::Client, volume: u32, pages: &[Vec<u8>]) -> Vec<f64> {
    pages
        .iter()
        .enumerate()
        .map(|(i, page)| {
            let started = Instant::now();
            client.write_page(volume, i as u64, WriteMode::Auto, page).expect("write a page");
            started.elapsed().as_secs_f64() * 1e6
        })
        .collect()
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[((values.len() as f64 * p) as usize).min(values.len() - 1)]
}

struct Round {
    single_us_p50: f64,
    replicated_us_p50: f64,
    replicated_us_p99: f64,
    single_us_p99: f64,
    follower_bytes_per_page: f64,
    compressed_bytes_per_page: f64,
}

fn round(count: usize) -> Round {
    let (pages, _) = pages(count);
    // A node alone.
    let site = common_serve::Site::new();
    let single = site.start();
    single.create_volume("bench", "64MiB", "8KiB", "normal");
    let mut client = single.client();
    let volume = client.volume_lookup("bench").expect("lookup").id;
    let mut single_us = write_all(&mut client, volume, &pages);
    drop(single);

    // Three nodes; the client talks to the chunk's leader.
    let mut cluster = Cluster::new(|_| None);
    cluster.start_all();
    succeeds(&["volume", "create", "bench", "--size", "64MiB", "--replicas", "3", "--addr", &cluster.member(1).addr()]);
    let leader = cluster.leader(1, "bench");
    let before = cluster.status(leader)["traffic"]["raft_bytes_sent"].as_u64().expect("traffic");
    let mut client = tundra_client::Client::connect(cluster.member(leader).native).expect("connect");
    let volume = client.volume_lookup("bench").expect("lookup").id;
    let mut replicated_us = write_all(&mut client, volume, &pages);
    // Let the followers hear the last commit index, so nothing of the run is still to send.
    std::thread::sleep(Duration::from_millis(300));
    let after = cluster.status(leader)["traffic"]["raft_bytes_sent"].as_u64().expect("traffic");
    let stats: serde_json::Value =
        serde_json::from_str(&client.stats(Some(volume)).expect("stats")).expect("stats are JSON");
    let compressed = stats["compressed_bytes"].as_u64().expect("compressed bytes");
    let follower_bytes_per_page = (after - before) as f64 / 2.0 / count as f64;
    Round {
        single_us_p50: median(&mut single_us),
        single_us_p99: percentile(&mut single_us, 0.99),
        replicated_us_p50: median(&mut replicated_us),
        replicated_us_p99: percentile(&mut replicated_us, 0.99),
        follower_bytes_per_page,
        compressed_bytes_per_page: compressed as f64 / count as f64,
    }
}

/// A results directory named relative to the repository's root (tests run in the crate's).
fn results_dir(dir: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(dir)
}

fn spread(values: &[f64]) -> (f64, f64, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    (sorted[sorted.len() / 2], sorted[0], sorted[sorted.len() - 1])
}

#[test]
fn replication_costs() {
    let out = std::env::var("TUNDRA_CLUSTER_BENCH_OUT").ok();
    let count: usize = match &out {
        Some(_) => std::env::var("TUNDRA_CLUSTER_BENCH_PAGES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000),
        None => 16,
    };
    let rounds = if out.is_some() { 3 } else { 1 };
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let results: Vec<Round> = (0..rounds).map(|_| round(count)).collect();
    let load_after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    for r in &results {
        assert!(r.single_us_p50 > 0.0 && r.replicated_us_p50 > 0.0);
        assert!(r.compressed_bytes_per_page > 0.0 && r.follower_bytes_per_page > 0.0);
    }
    let Some(dir) = out else { return };
    let (_, what) = pages(1);
    let ratio: Vec<f64> = results.iter().map(|r| r.replicated_us_p50 / r.single_us_p50).collect();
    let bytes: Vec<f64> = results.iter().map(|r| r.follower_bytes_per_page / r.compressed_bytes_per_page).collect();
    let mut text = String::new();
    writeln!(text, "# TUNDRA_CLUSTER_BENCH_OUT={dir} TUNDRA_CLUSTER_BENCH_PAGES={count} cargo test -p tundra --test cluster_bench -- --nocapture").unwrap();
    writeln!(text, "# pages: {count} 8 KiB pages of {what}, written at queue depth 1 over the native protocol")
        .unwrap();
    writeln!(text, "# build: the test profile (opt-level 1); both sides of each ratio in the same round").unwrap();
    writeln!(text, "# loadavg before: {}# loadavg after: {}", load_before, load_after).unwrap();
    writeln!(text, "round\tsingle_us_p50\tsingle_us_p99\treplicated_us_p50\treplicated_us_p99\tlatency_ratio_p50\tfollower_bytes_per_page\tcompressed_bytes_per_page\tbytes_ratio").unwrap();
    for (i, r) in results.iter().enumerate() {
        writeln!(
            text,
            "{i}\t{:.0}\t{:.0}\t{:.0}\t{:.0}\t{:.3}\t{:.1}\t{:.1}\t{:.4}",
            r.single_us_p50,
            r.single_us_p99,
            r.replicated_us_p50,
            r.replicated_us_p99,
            ratio[i],
            r.follower_bytes_per_page,
            r.compressed_bytes_per_page,
            bytes[i]
        )
        .unwrap();
    }
    let (m, lo, hi) = spread(&ratio);
    writeln!(text, "latency_ratio_p50 median {m:.3} (min {lo:.3}, max {hi:.3})").unwrap();
    let singles: Vec<f64> = results.iter().map(|r| r.single_us_p50).collect();
    let replicated: Vec<f64> = results.iter().map(|r| r.replicated_us_p50).collect();
    let (s, slo, shi) = spread(&singles);
    let (r, rlo, rhi) = spread(&replicated);
    writeln!(text, "single_us_p50 median {s:.0} (min {slo:.0}, max {shi:.0}); replicated_us_p50 median {r:.0} (min {rlo:.0}, max {rhi:.0})").unwrap();
    let (m, lo, hi) = spread(&bytes);
    writeln!(text, "bytes_ratio median {m:.4} (min {lo:.4}, max {hi:.4})").unwrap();
    std::fs::create_dir_all(results_dir(&dir)).expect("create the results directory");
    std::fs::write(results_dir(&dir).join("replication.txt"), &text).expect("write the results");
    print!("{text}");
}
