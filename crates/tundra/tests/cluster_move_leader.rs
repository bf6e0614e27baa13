//! Moving a chunk's replica off the node that leads the chunk's group, while a writer writes
//! through another node: the leader changes the voters to a set without itself (openraft's
//! joint consensus commits the change, then the old leader steps down), a new leader is
//! elected among the remaining replicas, the old leader's replica is dropped, and every page
//! reads back as the writer's log says, through every node.

mod common;
#[path = "common/cluster.rs"]
mod common_cluster;
#[path = "common/links.rs"]
mod common_links;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::succeeds;
use common_cluster::{Cluster, WriterLog, page_content as content, verify_log as verify};
use tundra_proto::WriteMode;

const DRIVE: &str = "physical = \"4GiB\"\nlogical = \"8GiB\"";

fn writer(addr: std::net::SocketAddr, volume: u32, stop: Arc<AtomicBool>) -> WriterLog {
    let mut client = tundra_client::Client::connect(addr).expect("connect");
    let mut log = WriterLog::new();
    let mut write = 0u64;
    while !stop.load(Ordering::Relaxed) {
        write += 1;
        let page = (write * 7) % 64;
        client.write_page(volume, page, WriteMode::Auto, &content(page, write)).expect("a write during the move");
        log.insert(page, write);
    }
    log
}

fn chunk0(status: &serde_json::Value, volume: &str) -> serde_json::Value {
    status["chunks"].as_array().expect("chunks[]").iter().find(|c| c["volume"] == volume).expect("chunk 0").clone()
}

fn ids(value: &serde_json::Value) -> Vec<u64> {
    value.as_array().expect("an array").iter().map(|n| n.as_u64().expect("a node id")).collect()
}

#[test]
fn moving_a_replica_off_the_chunks_leader_elects_another_and_loses_nothing() {
    let mut cluster = Cluster::of_size(4, |_| None, DRIVE);
    cluster.start_all();
    succeeds(&["volume", "create", "l", "--size", "64MiB", "--replicas", "3", "--addr", &cluster.member(1).addr()]);
    let volume =
        tundra_client::Client::connect(cluster.member(1).native).expect("connect").volume_lookup("l").expect("l").id;
    let leader = cluster.leader(1, "l");
    let status = cluster.status(1);
    let replicas = ids(&chunk0(&status, "l")["replicas"]);
    let term_before = chunk0(&status, "l")["term"].as_u64().expect("term");
    let target = (1..=4).find(|id| !replicas.contains(id)).expect("a node without a replica");
    // The writer and the command go through a replica that stays.
    let via = *replicas.iter().find(|&&id| id != leader).expect("a follower");

    let stop = Arc::new(AtomicBool::new(false));
    let writing = {
        let (addr, stop) = (cluster.member(via).native, stop.clone());
        std::thread::spawn(move || writer(addr, volume, stop))
    };
    std::thread::sleep(Duration::from_millis(500));
    let (from, to) = (leader.to_string(), target.to_string());
    succeeds(&[
        "cluster",
        "move",
        "--volume",
        "l",
        "--chunk",
        "0",
        "--from",
        &from,
        "--to",
        &to,
        "--addr",
        &cluster.member(via).addr(),
    ]);
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let log = writing.join().expect("the writer");
    assert!(log.len() > 10, "the writer wrote {} pages", log.len());

    // A new leader among the replicas left, in a later term; the old leader runs no replica.
    let started = Instant::now();
    let chunk = loop {
        let chunk = chunk0(&cluster.status(via), "l");
        let settled = chunk["leader"].as_u64().is_some_and(|l| l != leader);
        if settled || started.elapsed() > Duration::from_secs(20) {
            break chunk;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let now = ids(&chunk["replicas"]);
    assert!(!now.contains(&leader) && now.contains(&target) && now.len() == 3, "{chunk}");
    let new_leader = chunk["leader"].as_u64().expect("a leader");
    assert!(new_leader != leader && now.contains(&new_leader), "{chunk}\n{}", cluster.logs());
    assert!(chunk["term"].as_u64().expect("term") > term_before, "{chunk}");
    let status = cluster.status(via);
    let old = status["nodes"].as_array().expect("nodes[]").iter().find(|n| n["id"] == leader).expect("the old leader");
    assert_eq!(old["chunks"].as_array().expect("chunks").len(), 0, "{status:#}");

    for id in 1..=4 {
        verify(&cluster, id, volume, &log).unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    }
    // Twin: the check catches a page that does not hold the write the log names.
    let mut wrong = log.clone();
    *wrong.values_mut().next().expect("a page") += 1;
    assert!(verify(&cluster, via, volume, &wrong).is_err(), "the read-back check missed a wrong page");
}
