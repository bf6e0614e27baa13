//! The cluster manager as a Raft group of its own, with real processes: four `tundra serve` on
//! 127.0.0.1 (the manager's members are the three lowest ids). The manager's leader is killed
//! with kill -9 while a volume is created and again while a node is drained: a new leader
//! takes over, each operation completes or is refused and is retried until it does, every page
//! written before reads back through every node, and every node's catalog (the chunks' replica
//! sets), the groups each node runs and the manager's state agree. Without a quorum of its
//! members the manager refuses a drain with an error naming them; a restart of every node
//! keeps the manager's state (its Raft log and snapshot). The agreement oracle's twin feeds it
//! the live status altered as a diverged manager would show it.

mod common;
#[path = "common/cluster.rs"]
mod common_cluster;
#[path = "common/links.rs"]
mod common_links;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{fails, succeeds, tundra};
use common_cluster::Cluster;
use tundra_proto::WriteMode;

/// Drives (sparse files) with room for three 1 GiB chunks each under the fullness limit.
const DRIVE: &str = "physical = \"4GiB\"\nlogical = \"8GiB\"";
const PAGE: usize = 8192;
const PAGES_PER_CHUNK: u64 = (1 << 30) / PAGE as u64;
const WAIT: Duration = Duration::from_secs(60);

fn content(page: u64, write: u64) -> Vec<u8> {
    let mut bytes = format!("page {page} write {write} ").repeat(PAGE / 16).into_bytes();
    bytes.resize(PAGE, b'.');
    bytes
}

/// The manager object of node `asked`'s status once the manager has a leader.
fn manager(cluster: &Cluster, asked: u64) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let status = cluster.status(asked);
        if status["manager"]["leader"].as_u64().is_some() {
            return status["manager"].clone();
        }
        assert!(started.elapsed() < WAIT, "the manager has no leader: {status:#}\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Whether the catalog (each chunk's replica set), the groups each node runs and the manager's
/// state agree, with no move in flight anywhere.
fn agreement(status: &serde_json::Value) -> Result<(), String> {
    let manager = &status["manager"];
    let moves = manager["moves_in_flight"].as_array().map_or(0, Vec::len);
    if moves != 0 || manager["leader"].is_null() {
        return Err(format!("manager {manager}"));
    }
    let chunks = status["chunks"].as_array().ok_or("chunks[]")?;
    if manager["chunks"].as_u64() != Some(chunks.len() as u64) {
        return Err(format!("the manager counts {} chunks, the catalog {}", manager["chunks"], chunks.len()));
    }
    let mut catalog: BTreeMap<u64, usize> = BTreeMap::new();
    for chunk in chunks {
        for node in chunk["replicas"].as_array().ok_or("replicas")? {
            *catalog.entry(node.as_u64().ok_or("a node id")?).or_default() += 1;
        }
    }
    for node in status["nodes"].as_array().ok_or("nodes[]")? {
        let id = node["id"].as_u64().ok_or("id")?;
        let running = node["chunks"].as_array().map_or(0, Vec::len);
        let managed = manager["nodes"].as_array().and_then(|n| n.iter().find(|m| m["id"] == id)).ok_or("a node")?;
        let in_catalog = catalog.get(&id).copied().unwrap_or(0);
        if managed["chunks"].as_u64() != Some(in_catalog as u64) || running != in_catalog {
            return Err(format!(
                "node {id}: catalog {in_catalog}, groups run {running}, manager {}",
                managed["chunks"]
            ));
        }
    }
    Ok(())
}

fn agrees(cluster: &Cluster, asked: u64) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let status = cluster.status(asked);
        match agreement(&status) {
            Ok(()) => return status,
            Err(why) => assert!(started.elapsed() < WAIT, "{why}: {status:#}\n{}", cluster.logs()),
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn verify(cluster: &Cluster, volume: u32, pages: &[u64]) {
    for id in 1..=4 {
        let mut reader = tundra_client::Client::connect(cluster.member(id).native).expect("connect");
        for &page in pages {
            let read = reader.read_page(volume, page).expect("read");
            assert!(read == content(page, 1), "page {page} through node {id}");
        }
    }
}

/// Runs `args` in a thread, kills node `victim` with kill -9 after `delay`, restarts it, and
/// runs `args` again until it succeeds (bounded).
fn killed_midway(cluster: &mut Cluster, args: &[&str], victim: u64, delay: Duration) -> bool {
    let owned: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let running = std::thread::spawn(move || {
        let args: Vec<&str> = owned.iter().map(String::as_str).collect();
        tundra(&args).status.success()
    });
    std::thread::sleep(delay);
    cluster.kill9(victim);
    let first = running.join().expect("the command's thread");
    cluster.start(victim);
    manager(cluster, victim);
    if !first {
        let mut done = false;
        for _ in 0..10 {
            if tundra(args).status.success() {
                done = true;
                break;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        assert!(done, "tundra {args:?} never succeeded after the manager's leader died:\n{}", cluster.logs());
    }
    first
}

#[test]
fn the_manager_survives_its_leaders_death_and_a_restart_of_every_node() {
    let mut cluster = Cluster::of_size(4, |_| None, DRIVE);
    cluster.start_all();
    let m = manager(&cluster, 4);
    assert_eq!(m["members"], serde_json::json!([1, 2, 3]), "{m}");
    let addr4 = cluster.member(4).addr();
    succeeds(&["volume", "create", "a", "--size", "1536MiB", "--replicas", "3", "--addr", &addr4]);
    let volume = tundra_client::Client::connect(cluster.member(4).native).expect("c").volume_lookup("a").expect("a").id;
    let pages: Vec<u64> = (0..2).flat_map(|chunk| (0..8).map(move |i| chunk * PAGES_PER_CHUNK + i * 5)).collect();
    let mut client = tundra_client::Client::connect(cluster.member(4).native).expect("connect");
    for &page in &pages {
        client.write_page(volume, page, WriteMode::Auto, &content(page, 1)).expect("write");
    }
    drop(client);
    agrees(&cluster, 4);

    // The manager's leader dies while a volume is created through another node.
    let leader = manager(&cluster, 4)["leader"].as_u64().expect("leader");
    let via = if leader == 4 { 1 } else { 4 };
    let addr = cluster.member(via).addr();
    let args = ["volume", "create", "b", "--size", "16MiB", "--replicas", "3", "--addr", &addr];
    let first = killed_midway(&mut cluster, &args, leader, Duration::from_millis(20));
    println!("volume creation with the manager's leader (node {leader}) killed: first attempt succeeded: {first}");
    agrees(&cluster, 4);
    verify(&cluster, volume, &pages);

    // The manager's leader dies while a node is drained.
    let status = cluster.status(4);
    let leader = status["manager"]["leader"].as_u64().expect("leader");
    let drained = (1..=4u64)
        .rev()
        .find(|&n| {
            n != leader
                && status["chunks"]
                    .as_array()
                    .expect("chunks")
                    .iter()
                    .any(|c| c["replicas"].as_array().expect("r").contains(&n.into()))
        })
        .expect("a node other than the leader holds a replica");
    let via =
        if drained == 4 || leader == 4 { (1..=4).find(|&n| n != drained && n != leader).expect("a node") } else { 4 };
    let addr = cluster.member(via).addr();
    let node = drained.to_string();
    let args = ["cluster", "drain", &node, "--addr", &addr];
    let first = killed_midway(&mut cluster, &args, leader, Duration::from_millis(300));
    println!(
        "drain of node {drained} with the manager's leader (node {leader}) killed: first attempt succeeded: {first}"
    );
    let status = agrees(&cluster, via);
    let managed = status["manager"]["nodes"].as_array().expect("nodes").iter().find(|n| n["id"] == drained).cloned();
    assert_eq!(managed.as_ref().map(|n| n["status"].clone()), Some("draining".into()), "{status:#}");
    assert_eq!(managed.map(|n| n["chunks"].clone()), Some(0.into()), "{status:#}");
    verify(&cluster, volume, &pages);

    // No quorum of the manager's members: a drain is refused, naming them.
    cluster.kill9(2);
    cluster.kill9(3);
    let addr1 = cluster.member(1).addr();
    fails(&["cluster", "drain", "4", "--addr", &addr1], "the cluster manager has no quorum: members 1,2,3, up: 1");
    cluster.start(2);
    cluster.start(3);

    // Every node restarted: the manager's state comes back from its log and snapshot.
    let before = agrees(&cluster, 1)["manager"].clone();
    for id in 1..=4 {
        cluster.kill9(id);
    }
    cluster.start_all();
    let after = agrees(&cluster, 2)["manager"].clone();
    // The manager's record of each node, without how old its last report is.
    let recorded = |manager: &serde_json::Value| -> Vec<serde_json::Value> {
        let mut nodes = manager["nodes"].as_array().expect("nodes").clone();
        for node in &mut nodes {
            if let Some(node) = node.as_object_mut() {
                node.remove("report_age_ms");
                node.remove("unknown");
            }
        }
        nodes
    };
    assert_eq!(recorded(&after), recorded(&before), "{before:#} then {after:#}");
    assert_eq!(after["chunks"], before["chunks"]);
    assert!(after["applied_index"].as_u64() >= before["applied_index"].as_u64(), "{before:#} then {after:#}");
    verify(&cluster, volume, &pages);
    // Node 3's catalog catches up with the groups' membership after its restart (dead_nodes.rs)
    // and may lag the manager until then: the twin takes its status once it agrees.
    agreement_catches_a_diverged_manager(&agrees(&cluster, 3));
}

/// The twin of the agreement oracle: the same live status, altered as a manager whose state
/// diverged from the catalogs would show it, must fail it.
fn agreement_catches_a_diverged_manager(status: &serde_json::Value) {
    agreement(status).expect("the live status agrees");
    let chunks = status["manager"]["chunks"].as_u64().expect("chunks");
    let mut lost_chunk = status.clone();
    lost_chunk["manager"]["chunks"] = (chunks - 1).into();
    let mut miscounted = status.clone();
    let held = miscounted["manager"]["nodes"][0]["chunks"].as_u64().expect("a node's chunks");
    miscounted["manager"]["nodes"][0]["chunks"] = (held + 1).into();
    let mut stuck_move = status.clone();
    stuck_move["manager"]["moves_in_flight"] = serde_json::json!([{ "volume_id": 1, "chunk": 0, "from": 1, "to": 4 }]);
    let mut leaderless = status.clone();
    leaderless["manager"]["leader"] = serde_json::Value::Null;
    for (what, altered) in [
        ("a lost chunk", lost_chunk),
        ("a miscounted node", miscounted),
        ("a move left in flight", stuck_move),
        ("no leader", leaderless),
    ] {
        assert!(agreement(&altered).is_err(), "the oracle missed {what}");
    }
}
