//! A replicated redo commit's latency, measured on real processes: batches of redo appended at
//! queue depth 1 over the native protocol to a node alone and to the leader of a replicated
//! volume's redo group in a three-node cluster on 127.0.0.1 (seed 000 §5.2, Figure 13c,
//! reports 59 µs with three replicas). The ratio is what the redo group adds: a loopback round trip,
//! a follower's Raft log sync and the leader's own (a replica's apply does not wait for its
//! node-local redo log's sync, which a node alone pays). Each round also runs the replicated side
//! again with synced applies (`TUNDRA_TEST_REDO_APPLY_SYNCED=1`), the baseline of the deferral.
//!
//! By default it runs tiny (a few batches, one round) so that it cannot rot. With
//! `TUNDRA_REDO_BENCH_OUT=DIR` it runs three rounds of `TUNDRA_REDO_BENCH_COMMITS` (default
//! 1,000) batches of one record of 512 bytes (a commit's redo) and writes each round's
//! percentiles, the medians of the rounds, each round's ratio and the machine's load to
//! DIR/redo-replicated.txt.

mod common;
#[path = "common/cluster.rs"]
mod common_cluster;
#[path = "common/links.rs"]
mod common_links;
#[path = "common/serve.rs"]
#[allow(dead_code)]
mod common_serve;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::succeeds;
use common_cluster::Cluster;
use tundra_proto::{AppendOutcome, RedoAppend};
use tundra_redo::codec::encode_record;
use tundra_redo::{Payload, RedoRecord};
use tundra_store::ids::Lsn;

const RECORD_BYTES: usize = 512;

fn out_dir() -> Option<String> {
    std::env::var("TUNDRA_REDO_BENCH_OUT").ok()
}

fn commits() -> usize {
    match out_dir() {
        Some(_) => std::env::var("TUNDRA_REDO_BENCH_COMMITS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000),
        None => 20,
    }
}

/// Appends `count` batches of one 512-byte record (LSNs from `from + 1`), each waited for;
/// returns each append's microseconds.
fn append_all(client: &mut tundra_client::Client, volume: u32, from: u64, count: usize) -> Vec<f64> {
    (0..count as u64)
        .map(|i| {
            let lsn = from + i + 1;
            let payload = Payload::Ranges(vec![((lsn % 8) as u32 * 600, vec![(lsn % 251) as u8; RECORD_BYTES])]);
            let mut bytes = Vec::new();
            encode_record(&RedoRecord { lsn: Lsn(lsn), page: lsn % 64, payload }, &mut bytes);
            let append = RedoAppend {
                volume,
                writer_epoch: 1,
                prev_lsn: lsn - 1,
                end_lsn: lsn,
                record_count: 1,
                records: &bytes,
            };
            let started = Instant::now();
            let outcome = client.append_redo(&append).expect("append");
            let took = started.elapsed().as_secs_f64() * 1e6;
            assert_eq!(outcome, AppendOutcome::Ok { durable_lsn: lsn });
            took
        })
        .collect()
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[((values.len() as f64 * p) as usize).min(values.len() - 1)]
}

struct Round {
    single_p50: f64,
    single_p99: f64,
    replicated_p50: f64,
    replicated_p99: f64,
    /// Replicated with every apply waiting for the node-local redo log's sync.
    synced_p50: f64,
    synced_p99: f64,
}

fn round(count: usize) -> Round {
    let site = common_serve::Site::new();
    let single = site.start();
    single.create_volume("wal", "16MiB", "8KiB", "normal");
    let mut client = single.client();
    let volume = client.volume_lookup("wal").expect("lookup").id;
    // The first batch gives the volume its stream; it is not counted.
    append_all(&mut client, volume, 0, 1);
    let mut single_us = append_all(&mut client, volume, 1, count);
    drop(single);

    let (replicated_p50, replicated_p99) = replicated(count, false);
    let (synced_p50, synced_p99) = replicated(count, true);
    Round {
        single_p50: percentile(&mut single_us, 0.5),
        single_p99: percentile(&mut single_us, 0.99),
        replicated_p50,
        replicated_p99,
        synced_p50,
        synced_p99,
    }
}

/// Three nodes, `count` batches at the redo group's leader: p50 and p99 microseconds. With
/// `synced`, every replica's apply waits for its node-local redo log's sync
/// (`TUNDRA_TEST_REDO_APPLY_SYNCED=1`), the baseline of deferred applies.
fn replicated(count: usize, synced: bool) -> (f64, f64) {
    let mut cluster = Cluster::new(|_| None);
    if synced {
        cluster.env = vec![("TUNDRA_TEST_REDO_APPLY_SYNCED".to_string(), "1".to_string())];
    }
    cluster.start_all();
    succeeds(&["volume", "create", "wal", "--size", "16MiB", "--replicas", "3", "--addr", &cluster.member(1).addr()]);
    let mut client = tundra_client::Client::connect(cluster.member(1).native).expect("connect");
    let volume = client.volume_lookup("wal").expect("lookup").id;
    append_all(&mut client, volume, 0, 1);
    // The writer talks to the redo group's leader, as a compute node near it would.
    let started = Instant::now();
    let leader = loop {
        let status = cluster.status(1);
        if let Some(leader) = status["redo"][0]["leader"].as_u64() {
            break leader;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "no redo leader: {status}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut client = tundra_client::Client::connect(cluster.member(leader).native).expect("connect");
    let mut replicated_us = append_all(&mut client, volume, 1, count);
    (percentile(&mut replicated_us, 0.5), percentile(&mut replicated_us, 0.99))
}

fn spread(values: &[f64]) -> (f64, f64, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    (sorted[sorted.len() / 2], sorted[0], sorted[sorted.len() - 1])
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn replicated_redo_commit_latency() {
    let out = out_dir();
    let rounds = if out.is_some() { 3 } else { 1 };
    let count = commits();
    let load_before = load();
    let results: Vec<Round> = (0..rounds).map(|_| round(count)).collect();
    let Some(dir) = out else { return };
    let mut text = String::new();
    let (flag, profile) =
        if cfg!(debug_assertions) { ("", "test-profile build") } else { (" --release", "release build") };
    writeln!(
        text,
        "# TUNDRA_REDO_BENCH_OUT={dir} TUNDRA_REDO_BENCH_COMMITS={count} cargo test{flag} -p tundra --test cluster_redo_bench -- --nocapture"
    )
    .unwrap();
    writeln!(text, "# batches of one {RECORD_BYTES}-byte record at queue depth 1 over the native protocol; {profile}")
        .unwrap();
    writeln!(text, "# node alone: tundra serve, one volume; replicated: three tundra serve on 127.0.0.1, the client at the redo group's leader").unwrap();
    writeln!(text, "# synced: replicated again on fresh nodes, each replica's apply waiting for its node-local redo log's sync (TUNDRA_TEST_REDO_APPLY_SYNCED=1, the applies before they were deferred); deferred_over_synced is replicated over synced").unwrap();
    writeln!(text, "load_average_before {load_before}").unwrap();
    for (i, r) in results.iter().enumerate() {
        writeln!(
            text,
            "round {}: single_us p50 {:.0} p99 {:.0}; replicated_us p50 {:.0} p99 {:.0}; ratio_p50 {:.3}; synced_us p50 {:.0} p99 {:.0}; deferred_over_synced_p50 {:.3}",
            i + 1,
            r.single_p50,
            r.single_p99,
            r.replicated_p50,
            r.replicated_p99,
            r.replicated_p50 / r.single_p50,
            r.synced_p50,
            r.synced_p99,
            r.replicated_p50 / r.synced_p50
        )
        .unwrap();
    }
    let (s, slo, shi) = spread(&results.iter().map(|r| r.single_p50).collect::<Vec<_>>());
    let (p, plo, phi) = spread(&results.iter().map(|r| r.replicated_p50).collect::<Vec<_>>());
    let (m, lo, hi) = spread(&results.iter().map(|r| r.replicated_p50 / r.single_p50).collect::<Vec<_>>());
    writeln!(text, "single_us_p50 median {s:.0} (min {slo:.0}, max {shi:.0}); replicated_us_p50 median {p:.0} (min {plo:.0}, max {phi:.0})").unwrap();
    writeln!(text, "latency_ratio_p50 median {m:.3} (min {lo:.3}, max {hi:.3})").unwrap();
    let (q, qlo, qhi) = spread(&results.iter().map(|r| r.synced_p50).collect::<Vec<_>>());
    let (d, dlo, dhi) = spread(&results.iter().map(|r| r.replicated_p50 / r.synced_p50).collect::<Vec<_>>());
    writeln!(text, "synced_us_p50 median {q:.0} (min {qlo:.0}, max {qhi:.0}); deferred_over_synced_p50 median {d:.3} (min {dlo:.3}, max {dhi:.3})").unwrap();
    writeln!(text, "load_average_after {}", load()).unwrap();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(&dir);
    std::fs::create_dir_all(&dir).expect("results dir");
    std::fs::write(dir.join("redo-replicated.txt"), &text).expect("write results");
    print!("{text}");
}
