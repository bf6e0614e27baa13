//! A node added to a running cluster receives chunks (issue 15), with real `tundra serve`
//! processes on 127.0.0.1. Three nodes run with `peers` naming only themselves; two replicated
//! volumes are created and written. The operator adds node 4 in one of the two ways docs/cli.md
//! gives: node 4's entry added to every node's `peers` and nodes 1 to 3 restarted one at a
//! time (each waits for every chunk group to have a leader again), then node 4 started on an
//! empty data directory; or node 4 started first and `tundra cluster add-node` run, with no
//! restart. It reports to the cluster manager, adopts the volumes' definitions from its
//! peers' catalogs, and `tundra cluster rebalance --policy logical` moves chunk replicas onto it
//! (the logical rule: a node far below the average logical usage receives chunks) while a
//! writer keeps writing through node 2. Afterwards node 4 holds replicas, and every page reads
//! back as the writer's log says through every node, node 4 included.

mod common;
#[path = "common/cluster.rs"]
mod common_cluster;
#[path = "common/links.rs"]
mod common_links;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::succeeds;
use common_cluster::{Cluster, WriterLog, page_content, verify_log};
use serde_json::Value;
use tundra_proto::WriteMode;

/// Room for five 1 GiB chunks on each node.
const DRIVE: &str = "physical = \"8GiB\"\nlogical = \"16GiB\"";
const PAGES_PER_CHUNK: u64 = (1 << 30) / 8192;
/// How long the cluster may take to settle after a restart or a start.
const SETTLE: Duration = Duration::from_secs(40);

/// The configuration text of node `id` without node 4 in its `peers`.
fn without_node_4(text: &str) -> String {
    let start = text.find(", \"4@").expect("node 4 in peers");
    // `, "4@HOST:PORT"`: the closing quote is the first after the opening one.
    let closing = start + 3 + text[start + 3..].find('"').expect("closing quote");
    format!("{}{}", &text[..start], &text[closing + 1..])
}

/// Waits until node `asked` sees every chunk group of the cluster with a leader and the
/// manager counting `nodes` nodes, none unknown.
fn settled(cluster: &Cluster, asked: u64, nodes: usize) {
    let started = Instant::now();
    loop {
        let status = cluster.status(asked);
        let chunks = status["chunks"].as_array().cloned().unwrap_or_default();
        let led = !chunks.is_empty() && chunks.iter().all(|c| c["leader"].as_u64().is_some());
        let manager = &status["manager"];
        let counted = manager["nodes"].as_array().map_or(0, Vec::len) == nodes
            && manager["unknown_nodes"] == serde_json::json!([])
            && manager["leader"].as_u64().is_some();
        if led && counted {
            return;
        }
        assert!(started.elapsed() < SETTLE, "the cluster never settled: {status:#}\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// A writer of pages of both chunks of a volume, one at a time, on a thread of its own.
struct Writer {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<WriterLog>,
}

impl Writer {
    fn start(addr: std::net::SocketAddr, volume: u32) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut client = tundra_client::Client::connect(addr).expect("connect");
            let pages: Vec<u64> = (0..16).chain((0..16).map(|i| PAGES_PER_CHUNK + i)).collect();
            let mut log = WriterLog::new();
            let mut write = 0u64;
            while !stopped.load(Ordering::Relaxed) {
                write += 1;
                let page = pages[(write * 7) as usize % pages.len()];
                client.write_page(volume, page, WriteMode::Auto, &page_content(page, write)).expect("a write");
                log.insert(page, write);
            }
            log
        });
        Writer { stop, thread }
    }

    /// Stops it and returns its log: each page's last acknowledged write.
    fn finish(self) -> WriterLog {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the writer")
    }
}

/// The nodes holding replicas of any chunk, from `cluster status --json`.
fn replicas_on(status: &Value, node: u64) -> usize {
    let chunks = status["chunks"].as_array().cloned().unwrap_or_default();
    chunks
        .iter()
        .filter(|c| c["replicas"].as_array().is_some_and(|r| r.iter().any(|n| n.as_u64() == Some(node))))
        .count()
}

/// How node 4 joins three running nodes.
#[derive(Clone, Copy, PartialEq)]
enum Join {
    /// Its entry added to every node's `peers`, nodes 1 to 3 restarted one at a time.
    RollingRestart,
    /// `tundra cluster add-node`, no restart.
    AddNode,
}

#[test]
fn a_node_added_by_a_rolling_restart_receives_chunks_under_a_writer() {
    join_and_rebalance(Join::RollingRestart);
}

/// The same with `tundra cluster add-node` and no restart, node 3 down while it runs (it learns
/// node 4 from its peers when it returns); then node 1 restarts with its old `peers` (without
/// node 4) and still links node 4, kept in its data directory; and the command refuses what it
/// must.
#[test]
fn a_node_added_with_add_node_receives_chunks_without_a_restart() {
    let cluster = join_and_rebalance(Join::AddNode);
    let addr = cluster.member(2).addr();
    let node_4 = cluster.status(1)["nodes"].as_array().expect("nodes")[3]["addr"].as_str().expect("addr").to_string();
    // Again: nothing changes.
    let again = succeeds(&["cluster", "add-node", &format!("4@{node_4}"), "--addr", &addr]);
    assert!(String::from_utf8_lossy(&again.stdout).contains("a member already"));
    common::fails(&["cluster", "add-node", "4@127.0.0.1:1", "--addr", &addr], "node 4 is at");
    common::fails(&["cluster", "add-node", &format!("5@{node_4}"), "--addr", &addr], "is at");
    common::fails(&["cluster", "add-node", "5", "--addr", &addr], "ID@HOST:PORT");
    common::fails(&["cluster", "add-node", "5@10.1.2.3:7000", "--addr", &addr], "no key_file");
    let nodes = |status: &Value| status["nodes"].as_array().map_or(0, Vec::len);
    assert_eq!(nodes(&cluster.status(2)), 4, "a refused addition adds nothing");
}

/// Three nodes with node 4 in no one's `peers`, two volumes written; node 4 joins as `how`
/// says and `tundra cluster rebalance --policy logical` moves chunk replicas onto it under a
/// writer; every page then reads back through every node. Answers the cluster.
fn join_and_rebalance(how: Join) -> Cluster {
    let mut cluster = Cluster::of_size(4, |_| None, DRIVE);
    let full: Vec<String> =
        (1..=3).map(|id| std::fs::read_to_string(&cluster.member(id).config).expect("config")).collect();
    for id in 1..=3u64 {
        let text = without_node_4(&full[id as usize - 1]);
        assert!(!text.contains("\"4@"), "{text}");
        std::fs::write(&cluster.member(id).config, text).expect("write config");
    }
    for id in 1..=3 {
        cluster.start(id);
    }
    let addr = cluster.member(1).addr();
    let mut volumes = Vec::new();
    for name in ["a", "b"] {
        succeeds(&["volume", "create", name, "--size", "2GiB", "--replicas", "3", "--addr", &addr]);
        let mut client = tundra_client::Client::connect(cluster.member(1).native).expect("connect");
        volumes.push(client.volume_lookup(name).expect("lookup").id);
    }
    settled(&cluster, 1, 3);
    // Volume b's pages, written once before node 4 exists.
    let early = Writer::start(cluster.member(3).native, volumes[1]);
    std::thread::sleep(Duration::from_secs(1));
    let log_b = early.finish();
    assert!(!log_b.is_empty());

    match how {
        Join::RollingRestart => {
            // Node 4 enters every node's peers; nodes 1 to 3 restart one at a time.
            for id in 1..=3u64 {
                std::fs::write(&cluster.member(id).config, &full[id as usize - 1]).expect("write config");
                cluster.stop(id);
                cluster.start(id);
                settled(&cluster, id, 3);
            }
            cluster.start(4);
        }
        Join::AddNode => {
            cluster.start(4);
            let peer =
                full[0][full[0].find("\"4@").expect("node 4") + 1..].split('"').next().expect("peer").to_string();
            // Node 3 is down during the addition: the command names it, the others link node 4,
            // and node 3 learns node 4 from its peers once it is back (its catalog catch-up).
            cluster.stop(3);
            common::fails(
                &["cluster", "add-node", &peer, "--addr", &cluster.member(2).addr()],
                "nodes [3] did not answer",
            );
            cluster.start(3);
            let started = Instant::now();
            loop {
                let status = cluster.status(3);
                let nodes = status["nodes"].as_array().cloned().unwrap_or_default();
                if nodes.iter().any(|n| n["id"] == 4 && n["up"] == true) {
                    break;
                }
                assert!(started.elapsed() < SETTLE, "node 3 never learnt node 4: {status:#}\n{}", cluster.logs());
                std::thread::sleep(Duration::from_millis(300));
            }
            assert!(cluster.member(3).log_text().contains("learnt node 4 at"), "node 3 says where it learnt node 4");
        }
    }
    settled(&cluster, 1, 4);
    let before = cluster.status(1);
    assert_eq!(replicas_on(&before, 4), 0, "node 4 starts empty: {before:#}");

    let writing = Writer::start(cluster.member(2).native, volumes[0]);
    std::thread::sleep(Duration::from_secs(1));
    let out = succeeds(&["cluster", "rebalance", "--policy", "logical", "--json", "--addr", &addr]);
    std::thread::sleep(Duration::from_millis(500));
    let log_a = writing.finish();
    let report: Value = serde_json::from_slice(&out.stdout).expect("rebalance JSON");
    let moves = report["moves"].as_array().cloned().unwrap_or_default();
    assert!(!moves.is_empty(), "the new node received nothing: {report:#}");
    assert!(moves.iter().all(|m| m["to"].as_u64() == Some(4)), "every move goes to the new node: {report:#}");

    let after = cluster.status(1);
    let on_4 = replicas_on(&after, 4);
    assert_eq!(on_4, moves.len(), "node 4 holds a replica per move: {after:#}");
    let managed = after["manager"]["nodes"].as_array().expect("manager nodes").clone();
    let node_4 = managed.iter().find(|n| n["id"].as_u64() == Some(4)).expect("node 4 managed");
    assert_eq!(node_4["chunks"].as_u64(), Some(on_4 as u64), "the manager counts them: {node_4:#}");
    println!("node 4 received {on_4} chunk replicas; the writer wrote {} pages during the moves", log_a.len());

    for id in 1..=4 {
        verify_log(&cluster, id, volumes[0], &log_a).unwrap_or_else(|why| panic!("{why}\n{}", cluster.logs()));
        verify_log(&cluster, id, volumes[1], &log_b).unwrap_or_else(|why| panic!("{why}\n{}", cluster.logs()));
    }
    // Node 4 serves what it holds: a page read through it is the writer's last.
    let (&page, &write) = log_a.iter().next().expect("a page");
    let mut client = tundra_client::Client::connect(cluster.member(4).native).expect("connect");
    assert_eq!(client.read_page(volumes[0], page).expect("read"), page_content(page, write));
    drop(client);
    if how == Join::AddNode {
        // Node 1 restarts with its config as it was, without node 4: the node added is kept in
        // its data directory, so it links node 4 again and reads through it still work.
        let config = std::fs::read_to_string(&cluster.member(1).config).expect("config");
        assert!(!config.contains("\"4@"), "node 1's config never named node 4");
        cluster.stop(1);
        cluster.start(1);
        settled(&cluster, 1, 4);
        let status = cluster.status(1);
        let up_4 = status["nodes"].as_array().expect("nodes").iter().any(|n| n["id"] == 4 && n["up"] == true);
        assert!(up_4, "node 1 does not link node 4 after its restart: {status:#}");
        for id in 1..=4 {
            verify_log(&cluster, id, volumes[0], &log_a).unwrap_or_else(|why| panic!("{why}\n{}", cluster.logs()));
        }
    }
    cluster
}
