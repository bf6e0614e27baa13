//! A cluster end to end: three `tundra serve` processes on 127.0.0.1 with a `[cluster]`
//! section, a replicated volume created with `tundra volume create --replicas 3`, a real file
//! written over NBD with `nbdcopy --flush` to one node, the chunk's leader killed with kill -9,
//! the file read back identical through another node (and written there meanwhile: a stall,
//! not an error), the killed node restarted and seen caught up by `tundra cluster status`.
//! Also: peers without the cluster's key are kept out, and a node refuses to listen for peers
//! beyond loopback without a key.
//!
//! The real file is a PostgreSQL table's heap (`target/realdata/flights.heap`, made by
//! scripts/pg-real-table) when there is one, else the first 6 MiB of the `tundra` binary;
//! with `TUNDRA_REQUIRE_REALDATA=1` (as scripts/test runs it) a missing heap fails the test.
//! The test prints which input it used.

mod common;
#[path = "common/cluster.rs"]
mod common_cluster;
#[path = "common/links.rs"]
mod common_links;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{fails, realdata_heap, succeeds};
use common_cluster::{Cluster, nbdcopy};

/// How long a restarted node may take to catch up.
const CATCH_UP: Duration = Duration::from_secs(60);

fn real_file(dir: &std::path::Path) -> (PathBuf, &'static str) {
    let (bytes, what) = match realdata_heap(1 << 20) {
        Some((heap, bytes)) => {
            println!("input: the PostgreSQL heap {} (its first {} bytes)", heap.display(), bytes.len().min(24 << 20));
            (bytes[..bytes.len().min(24 << 20)].to_vec(), "a PostgreSQL heap")
        }
        None => {
            let binary = std::fs::read(env!("CARGO_BIN_EXE_tundra")).expect("read the tundra binary");
            println!("input: the tundra binary's first 6 MiB (no target/realdata/flights.heap)");
            (binary[..binary.len().min(6 << 20)].to_vec(), "the tundra binary's first 6 MiB")
        }
    };
    let path = dir.join("real.file");
    std::fs::write(&path, bytes).expect("write the real file");
    (path, what)
}

/// Reads `len` bytes of `uri` into a file and returns them.
fn read_back(uri: &str, dir: &std::path::Path, name: &str, len: usize) -> Vec<u8> {
    let out = dir.join(name);
    nbdcopy(&[uri, out.to_str().expect("utf-8 path")]);
    let mut bytes = std::fs::read(&out).expect("read back");
    bytes.truncate(len);
    bytes
}

#[test]
fn a_killed_leader_fails_over_and_catches_up_after_its_restart() {
    let mut cluster = Cluster::new(|_| None);
    cluster.start_all();
    let (file, what) = real_file(cluster.path());
    let original = std::fs::read(&file).expect("read the real file");
    succeeds(&["volume", "create", "pg", "--size", "64MiB", "--replicas", "3", "--addr", &cluster.member(1).addr()]);
    nbdcopy(&["--flush", file.to_str().expect("utf-8"), &cluster.member(1).uri("pg")]);

    let leader = cluster.leader(1, "pg");
    cluster.kill9(leader);
    let survivor = (1..=3).find(|&id| id != leader).expect("a survivor");
    let read = read_back(&cluster.member(survivor).uri("pg"), cluster.path(), "after-kill", original.len());
    assert!(read == original, "{what} read back through node {survivor} after node {leader} was killed differs");

    // Writes to a surviving node go on (to the new leader) while the old one is down.
    let tail: Vec<u8> = original.iter().rev().take(1 << 20).copied().collect();
    let tail_file = cluster.path().join("tail");
    std::fs::write(&tail_file, &tail).expect("write");
    let other = (1..=3).find(|&id| id != leader && id != survivor).expect("a third node");
    nbdcopy(&["--flush", tail_file.to_str().expect("utf-8"), &cluster.member(other).uri("pg")]);

    cluster.start(leader);
    let status = cluster.caught_up(leader);
    let chunk = &status["chunks"][0];
    assert_eq!(chunk["replicas"], serde_json::json!([1, 2, 3]));
    assert!(chunk["term"].as_u64().is_some_and(|t| t >= 2), "a new term after the failover: {status:#}");
    // The restarted node serves the latest bytes too.
    let read = read_back(&cluster.member(leader).uri("pg"), cluster.path(), "after-restart", original.len());
    assert!(read[..tail.len()] == tail[..], "the write made during the failover is lost");
    assert!(read[tail.len()..] == original[tail.len()..], "{what} changed after the restart");
}

/// The twin of the rule scripts/test relies on: with the real heap required, a missing one
/// fails the test instead of letting it fall back to other bytes.
#[test]
#[should_panic(expected = "TUNDRA_REQUIRE_REALDATA=1 but")]
fn a_required_real_heap_that_is_missing_fails_the_test() {
    let dir = tempfile::tempdir().expect("temp dir");
    assert!(common::realdata_at(&dir.path().join("flights.heap"), 1, false).is_none());
    common::realdata_at(&dir.path().join("flights.heap"), 1, true);
}

#[test]
fn only_peers_holding_the_cluster_key_join() {
    let key = "a shared secret of at least thirty-two bytes";
    let mut cluster =
        Cluster::new(|id| Some(if id == 3 { "another secret, of thirty-two bytes or more" } else { key }.to_string()));
    cluster.start_all();
    // Nodes 1 and 2 connect; node 3, with another key, never does.
    let started = Instant::now();
    let status = loop {
        let status = cluster.status(1);
        let up: Vec<bool> = status["nodes"].as_array().expect("nodes").iter().map(|n| n["up"] == true).collect();
        if up[1] {
            break status;
        }
        assert!(started.elapsed() < CATCH_UP, "nodes 1 and 2 never connected: {status:#}\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(100));
    };
    let up: Vec<bool> = status["nodes"].as_array().expect("nodes").iter().map(|n| n["up"] == true).collect();
    assert_eq!(up, vec![true, true, false], "{status:#}");
    // Three replicas need three nodes: refused, naming the node that does not answer.
    let addr = cluster.member(1).addr();
    fails(&["volume", "create", "v", "--size", "16MiB", "--replicas", "3", "--addr", &addr], "node 3 does not answer");
    let log = cluster.member(3).log_text() + &cluster.member(1).log_text() + &cluster.member(2).log_text();
    assert!(log.contains("cluster key"), "no node said why the third was refused:\n{log}");
}

#[test]
fn a_peer_address_beyond_loopback_needs_a_key() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("node.toml");
    let text = format!(
        "data_dir = {:?}\n[listen]\nnative = \"\"\nnbd = \"\"\nmetrics = \"\"\n[drive]\nphysical = \"256MiB\"\n\
         [cluster]\nnode_id = 1\npeers = [\"1@0.0.0.0:1\", \"2@192.0.2.1:1\"]\n",
        dir.path().join("data").to_str().expect("utf-8")
    );
    std::fs::write(&config, text).expect("write config");
    let message = fails(&["serve", "--config", config.to_str().expect("utf-8")], "key_file");
    assert!(message.contains("loopback"), "{message}");
}

/// The `[drive]` section of a node holding `chunks` 1 GiB chunks of 8 KiB pages: `logical`
/// holds half the volumes' size, the journal checkpoint's page bound (docs/cli.md "Volumes"),
/// and `overcommit` lets the volumes pass it; the physical space stays small.
fn drive_for_chunks(chunks: usize) -> String {
    format!("physical = \"256MiB\"\nlogical = \"{}MiB\"\novercommit = true", (chunks + 1) * 512)
}

/// A node picks each new group's Raft timing from the groups it hosts once they are added, so
/// a volume of many chunks created on freshly started nodes elects every group in time. When
/// the timing was chosen once, when the node started with an empty catalog, every group
/// heartbeated every 50 ms, and 1,000 chunks timed out electing them (300 and 500 did not, on
/// two cores): `TUNDRA_MANY_CHUNKS=1000` runs that size (a couple of minutes; each node's drive
/// map then takes about 0.9 GB); by default 100 chunks, so that the test cannot rot. The
/// timing itself is checked in tundra-raft (`host_timing`).
#[test]
fn a_volume_of_many_chunks_on_fresh_nodes_elects_every_group() {
    let chunks: usize = std::env::var("TUNDRA_MANY_CHUNKS").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
    let mut cluster = Cluster::with_drive(|_| None, &drive_for_chunks(chunks));
    cluster.start_timeout = Duration::from_secs(600);
    cluster.start_all();
    let size = format!("{chunks}GiB");
    let started = Instant::now();
    let out = common::tundra(&[
        "volume",
        "create",
        "many",
        "--size",
        &size,
        "--replicas",
        "3",
        "--addr",
        &cluster.member(1).addr(),
    ]);
    println!("{chunks} chunks: created in {:.1} s", started.elapsed().as_secs_f64());
    assert!(out.status.success(), "creating {chunks} chunks failed: {}", String::from_utf8_lossy(&out.stderr));
    // Every group has a leader, as every node sees it.
    for id in 1..=3 {
        let status = cluster.status(id);
        let view: Vec<&serde_json::Value> =
            status["chunks"].as_array().expect("chunks").iter().filter(|c| c["volume"] == "many").collect();
        assert_eq!(view.len(), chunks, "node {id}: {status:#}");
        let leaderless = view.iter().filter(|c| c["leader"].as_u64().is_none()).count();
        assert_eq!(leaderless, 0, "node {id} sees {leaderless} of {chunks} groups without a leader");
    }
}

/// How many of `volume`'s groups each node leads, as node 1 sees it.
fn leaders_by_node(cluster: &Cluster, volume: &str) -> Vec<usize> {
    let status = cluster.status(1);
    let chunks: Vec<&serde_json::Value> =
        status["chunks"].as_array().expect("chunks").iter().filter(|c| c["volume"] == volume).collect();
    (1..=3).map(|id| chunks.iter().filter(|c| c["leader"].as_u64() == Some(id)).count()).collect()
}

/// The balance oracle: each of the three nodes leads `chunks / 3` groups, give or take 3.
fn leaders_balanced(led: &[usize], chunks: usize) -> Result<(), String> {
    let even = chunks / led.len();
    match led.iter().all(|&n| n.abs_diff(even) <= 3) && led.iter().sum::<usize>() == chunks {
        true => Ok(()),
        false => Err(format!("leaders per node {led:?} for {chunks} chunks")),
    }
}

/// A fresh volume's groups are led evenly by its replicas' nodes: each group is initialized
/// (and so first led) by the replica leading the fewest of the chunks before it. Its twin: the
/// oracle refuses what the old rule (every group initialized by its first replica) gave.
#[test]
fn a_fresh_volumes_leaders_spread_over_the_nodes() {
    assert!(leaders_balanced(&[30, 0, 0], 30).is_err(), "the oracle passed every group led by one node");
    assert!(leaders_balanced(&[14, 8, 8], 30).is_err());
    let chunks = 30;
    let mut cluster = Cluster::with_drive(|_| None, &drive_for_chunks(chunks));
    cluster.start_all();
    let out = common::tundra(&[
        "volume",
        "create",
        "spread",
        "--size",
        &format!("{chunks}GiB"),
        "--replicas",
        "3",
        "--addr",
        &cluster.member(1).addr(),
    ]);
    assert!(out.status.success(), "create failed: {}", String::from_utf8_lossy(&out.stderr));
    let led = leaders_by_node(&cluster, "spread");
    println!("leaders per node: {led:?}");
    leaders_balanced(&led, chunks).unwrap();
}
