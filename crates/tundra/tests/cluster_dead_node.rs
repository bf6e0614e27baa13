//! A dead node's replicas repaired without an operator (issue 15, "dead nodes"), with real
//! processes on 127.0.0.1: four `tundra serve` with `[cluster] repair_after = "5s"`, a volume of
//! two chunks with three replicas each, written with known pages.
//!
//! - A node holding replicas is killed with kill -9 while a writer keeps writing: within a
//!   bounded time the manager's leader has moved its chunk and redo replicas onto the up nodes
//!   (every chunk and the redo group on three up nodes, each of which runs it, as every
//!   surviving node's status says), and every page reads back through every surviving node as
//!   the writer's log says.
//! - The dead node is started again: it catches its catalog up from the groups' membership,
//!   drops its old replicas (no chunk left in its `nodes[]` entry, its drive's logical use
//!   back to zero), the groups keep their replicas, leaders and terms, and the volume reads
//!   back through it.
//! - A node started again once the repair moved one of its replicas (each learner's catch-up
//!   held 4 s by `TUNDRA_TEST_CATCH_UP_DELAY_MS`) is repaired no further: it keeps the rest,
//!   what moved stays moved, every group has three answering replicas, its catalog catches
//!   up and every page reads back through every node. Its twin (`TUNDRA_TEST_REPAIR_RETURNED=1`:
//!   the leader goes on repairing a node that reports again) empties the node, which the check
//!   catches.
//! - Three nodes, one killed: no up node can take its replicas, which stay, and the leader says
//!   why in `manager.repair.blocked`.
//! - The twin: with `repair_after = "off"` the dead node keeps its replicas and the repair's
//!   oracle fails. Then `tundra cluster drain` of the dead node moves them (a move needs no
//!   answer from its source), and the node, started again with its catalog catch-up off
//!   (`TUNDRA_TEST_CATCH_UP=off`), keeps its stale replicas running: the catch-up's oracle
//!   fails (its twin), and the groups keep their replicas, leaders and terms all the same.

mod common;
#[path = "common/cluster.rs"]
mod common_cluster;
#[path = "common/links.rs"]
mod common_links;

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::succeeds;
use common_cluster::{Cluster, WriterLog, page_content as content, verify_log as verify};
use tundra_proto::WriteMode;

/// Drives with room for two 1 GiB chunks each (placement counts a new chunk at its whole size).
const DRIVE: &str = "physical = \"4GiB\"\nlogical = \"8GiB\"";
const PAGE: usize = 8192;
const PAGES_PER_CHUNK: u64 = (1 << 30) / PAGE as u64;
/// How long the repair may take after the kill: the 5 s of silence, a manager election if
/// the leader died, and a few small moves, with room for a loaded machine.
const REPAIR_WAIT: Duration = Duration::from_secs(45);
/// How long the twin waits: more than twice `repair_after` and a few rounds.
const TWIN_WAIT: Duration = Duration::from_secs(14);
/// How long the restarted node's catch-up may take.
const CATCH_UP_WAIT: Duration = Duration::from_secs(30);
/// How long the groups are watched with the returning node up.
const WATCH: Duration = Duration::from_secs(5);

/// Four nodes with `repair_after`, and a volume "v" of two chunks written with known pages.
fn cluster(repair_after: &str) -> (Cluster, u32, WriterLog) {
    cluster_with(repair_after, &[])
}

/// [`cluster`] with `env` (test hooks) on every node.
fn cluster_with(repair_after: &str, env: &[(&str, &str)]) -> (Cluster, u32, WriterLog) {
    let mut cluster = Cluster::of_size(4, |_| None, DRIVE);
    for member in &cluster.members {
        let mut config = std::fs::OpenOptions::new().append(true).open(&member.config).expect("open config");
        // No leader balancing: a group's term then moves only when something disturbs it.
        writeln!(config, "repair_after = \"{repair_after}\"\nleader_balance_every = \"off\"").expect("write config");
    }
    cluster.env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    cluster.start_all();
    succeeds(&["volume", "create", "v", "--size", "2GiB", "--replicas", "3", "--addr", &cluster.member(1).addr()]);
    let mut client = tundra_client::Client::connect(cluster.member(1).native).expect("connect");
    let volume = client.volume_lookup("v").expect("lookup").id;
    let mut log = WriterLog::new();
    for page in (0..16).chain((0..16).map(|i| PAGES_PER_CHUNK + i * 3)) {
        client.write_page(volume, page, WriteMode::Auto, &content(page, 0)).expect("write");
        log.insert(page, 0);
    }
    (cluster, volume, log)
}

/// Writes pages of both chunks through node `via` until `stop`; returns what it wrote over
/// `base`.
fn writer(addr: std::net::SocketAddr, volume: u32, base: WriterLog, stop: Arc<AtomicBool>) -> WriterLog {
    let mut client = tundra_client::Client::connect(addr).expect("connect");
    let pages: Vec<u64> = base.keys().copied().collect();
    let mut log = base;
    let mut write = 0u64;
    while !stop.load(Ordering::Relaxed) {
        write += 1;
        let page = pages[(write * 7) as usize % pages.len()];
        client.write_page(volume, page, WriteMode::Auto, &content(page, write)).expect("a write during the repair");
        log.insert(page, write);
        std::thread::sleep(Duration::from_millis(20));
    }
    log
}

fn ids(value: &serde_json::Value) -> Vec<u64> {
    value.as_array().map_or(Vec::new(), |a| a.iter().filter_map(serde_json::Value::as_u64).collect())
}

/// The volume's groups (its chunks, then its redo group) as a status shows them.
fn groups(status: &serde_json::Value) -> Vec<serde_json::Value> {
    let of = |key: &str| -> Vec<serde_json::Value> {
        status[key].as_array().map_or(Vec::new(), |a| a.iter().filter(|g| g["volume"] == "v").cloned().collect())
    };
    of("chunks").into_iter().chain(of("redo")).collect()
}

/// The oracle of the repair: as each node of `up` sees it, the volume's two chunks and its redo
/// group each have three replicas, none of them in `dead`, a leader, and every replica running
/// the group (its applied index answered). Answers the status of the first of `up`.
fn repaired(cluster: &Cluster, up: &[u64], dead: u64, wait: Duration) -> Result<serde_json::Value, String> {
    let started = Instant::now();
    loop {
        let statuses: Vec<serde_json::Value> = up.iter().map(|&id| cluster.status(id)).collect();
        let bad = statuses.iter().zip(up).find_map(|(status, id)| {
            let groups = groups(status);
            let wrong = groups.iter().find(|g| {
                let replicas = ids(&g["replicas"]);
                let applied = g["replica_applied"].as_object().map_or(0, |a| a.values().filter(|v| v.is_u64()).count());
                replicas.len() != 3 || replicas.contains(&dead) || g["leader"].is_null() || applied != 3
            });
            match (groups.len(), wrong) {
                (3, None) => None,
                (count, wrong) => Some(format!("node {id} sees {count} groups, {wrong:?}")),
            }
        });
        match bad {
            None => return Ok(statuses.into_iter().next().expect("a status")),
            Some(why) if started.elapsed() >= wait => {
                return Err(format!("not repaired after {wait:?}: {why}\n{:#}", statuses[0]["manager"]));
            }
            Some(_) => std::thread::sleep(Duration::from_millis(300)),
        }
    }
}

/// The node that dies: one holding the most chunk replicas, not the manager's leader (whose
/// death would add an election to the wait).
fn victim(cluster: &Cluster) -> u64 {
    let status = cluster.status(1);
    let leader = status["manager"]["leader"].as_u64();
    let chunks = |id: u64| groups(&status).iter().take(2).filter(|g| ids(&g["replicas"]).contains(&id)).count();
    (1..=4).filter(|&id| Some(id) != leader).max_by_key(|&id| (chunks(id), id)).expect("a node")
}

/// Each group's replicas, leader and term as node `asked` sees them.
fn shape(cluster: &Cluster, asked: u64) -> Vec<(Vec<u64>, u64, u64)> {
    groups(&cluster.status(asked))
        .iter()
        .map(|g| (ids(&g["replicas"]), g["leader"].as_u64().unwrap_or(0), g["term"].as_u64().unwrap_or(0)))
        .collect()
}

/// The oracle of the catch-up: node `id` runs no chunk replica and holds no page.
fn dropped(cluster: &Cluster, id: u64, wait: Duration) -> Result<serde_json::Value, String> {
    let started = Instant::now();
    loop {
        let status = cluster.status(id);
        let node = status["nodes"].as_array().and_then(|n| n.iter().find(|n| n["id"] == id).cloned());
        let node = node.unwrap_or_default();
        let held = node["chunks"].as_array().map_or(usize::MAX, Vec::len);
        let logical = node["usage"]["logical_used_bytes"].as_u64();
        let in_catalog = groups(&status).iter().any(|g| ids(&g["replicas"]).contains(&id));
        if held == 0 && logical == Some(0) && !in_catalog {
            return Ok(status);
        }
        if started.elapsed() >= wait {
            return Err(format!("node {id} runs {held} chunks, logical {logical:?}, in its catalog {in_catalog}"));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn a_dead_nodes_replicas_are_repaired_and_it_drops_them_when_it_returns() {
    let (mut cluster, volume, log) = cluster("5s");
    let dead = victim(&cluster);
    let up: Vec<u64> = (1..=4).filter(|&id| id != dead).collect();
    let before = cluster.status(up[0]);
    let held_before = groups(&before).iter().filter(|g| ids(&g["replicas"]).contains(&dead)).count();
    assert!(held_before >= 1, "node {dead} holds replicas: {before:#}");
    let used_before = before["nodes"][dead as usize - 1]["usage"]["logical_used_bytes"].as_u64().expect("used");
    assert!(used_before > 0, "{before:#}");

    let stop = Arc::new(AtomicBool::new(false));
    let writing = {
        let (addr, stop, base) = (cluster.member(up[0]).native, stop.clone(), log.clone());
        std::thread::spawn(move || writer(addr, volume, base, stop))
    };
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    cluster.kill9(dead);
    let after = repaired(&cluster, &up, dead, REPAIR_WAIT).unwrap_or_else(|why| panic!("{why}\n{}", cluster.logs()));
    println!("node {dead} killed: repaired after {:.1} s", started.elapsed().as_secs_f64());
    let repair = &after["manager"]["repair"];
    assert_eq!(repair["after_ms"], 5000, "{repair:#}");
    assert!(repair["moves_total"].as_u64().unwrap_or(0) >= 1, "{repair:#}");
    assert_eq!(repair["last_repair"]["node"], dead, "{repair:#}");
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let log = writing.join().expect("the writer");
    for &id in &up {
        verify(&cluster, id, volume, &log).unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    }
    let mut wrong = log.clone();
    *wrong.values_mut().last().expect("a page") += 1;
    assert!(verify(&cluster, up[0], volume, &wrong).is_err(), "the read-back check missed a wrong page");

    // The dead node returns: it drops what it lost, and the groups do not notice it.
    let settled = shape(&cluster, up[0]);
    cluster.start(dead);
    let back = dropped(&cluster, dead, CATCH_UP_WAIT).unwrap_or_else(|why| panic!("{why}\n{}", cluster.logs()));
    assert!(cluster.member(dead).log_text().contains("is no longer a replica"), "{}", cluster.member(dead).log_text());
    std::thread::sleep(WATCH);
    assert_eq!(shape(&cluster, up[0]), settled, "the returning node disturbed the groups");
    assert_eq!(shape(&cluster, dead), settled, "its catalog caught up: {back:#}");
    repaired(&cluster, &up, dead, Duration::ZERO).unwrap_or_else(|why| panic!("{why}\n{}", cluster.logs()));
    verify(&cluster, dead, volume, &log).unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    for line in
        cluster.logs().lines().filter(|l| l.contains("repair:") || l.contains("catch-up") || l.starts_with("---"))
    {
        println!("{line}");
    }
}

#[test]
fn without_repair_a_dead_node_keeps_its_replicas_until_an_operator_drains_it() {
    let (mut cluster, volume, log) = cluster("off");
    let dead = victim(&cluster);
    let up: Vec<u64> = (1..=4).filter(|&id| id != dead).collect();
    cluster.kill9(dead);
    let outcome = repaired(&cluster, &up, dead, TWIN_WAIT);
    assert!(outcome.is_err(), "the oracle passed with the repair off: {outcome:?}");
    let status = cluster.status(up[0]);
    assert!(groups(&status).iter().any(|g| ids(&g["replicas"]).contains(&dead)), "{status:#}");
    assert!(status["manager"]["repair"]["after_ms"].is_null(), "{:#}", status["manager"]);

    // A move needs only the catalogs of the coordinator, the target and a majority of the
    // group: the operator drains the dead node.
    let out = succeeds(&["cluster", "drain", &dead.to_string(), "--addr", &cluster.member(up[0]).addr()]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains(&format!("node {dead} holds no chunk")), "{text}");
    repaired(&cluster, &up, dead, Duration::ZERO).unwrap_or_else(|why| panic!("{why}\n{}", cluster.logs()));

    // The twin of the catch-up's oracle: the node comes back with its catch-up off, so its
    // stale replicas keep running (and campaigning), which the oracle must catch; the groups
    // must not mind them.
    let settled = shape(&cluster, up[0]);
    cluster.env = vec![("TUNDRA_TEST_CATCH_UP".into(), "off".into())];
    cluster.start(dead);
    let outcome = dropped(&cluster, dead, CATCH_UP_WAIT / 3);
    assert!(outcome.is_err(), "the catch-up's oracle passed with the catch-up off: {outcome:?}");
    assert_eq!(shape(&cluster, up[0]), settled, "a stale replica disturbed the groups");
    for &id in &up {
        verify(&cluster, id, volume, &log).unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    }
}

#[test]
fn a_dead_node_whose_replicas_no_up_node_can_take_keeps_them_and_status_says_why() {
    let mut cluster = Cluster::of_size(3, |_| None, DRIVE);
    for member in &cluster.members {
        let mut config = std::fs::OpenOptions::new().append(true).open(&member.config).expect("open config");
        writeln!(config, "repair_after = \"5s\"").expect("write config");
    }
    cluster.start_all();
    succeeds(&["volume", "create", "v", "--size", "64MiB", "--replicas", "3", "--addr", &cluster.member(1).addr()]);
    let leader = cluster.status(1)["manager"]["leader"].as_u64().expect("a manager leader");
    let dead = (1..=3).rev().find(|&id| id != leader).expect("a node that does not lead the manager");
    cluster.kill9(dead);
    let started = Instant::now();
    let manager = loop {
        let manager = cluster.status(leader)["manager"].clone();
        let blocked = manager["repair"]["blocked"].as_array().map_or(0, Vec::len);
        if ids(&manager["repair"]["repairing"]) == vec![dead] && blocked >= 2 {
            break manager;
        }
        assert!(started.elapsed() < REPAIR_WAIT, "no blocked repair: {manager:#}\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(300));
    };
    let text = manager["repair"]["blocked"].to_string();
    assert!(text.contains("no up active node can take it"), "{text}");
    assert!(text.contains("every up node holds one already"), "{text}");
    assert_eq!(manager["repair"]["moves_total"], 0, "{manager:#}");
    let status = cluster.status(leader);
    assert!(groups(&status).iter().all(|g| ids(&g["replicas"]).contains(&dead)), "{status:#}");
}

/// The volume's groups that list `node` among their replicas, as node `asked` sees them.
fn held_by(cluster: &Cluster, asked: u64, node: u64) -> usize {
    groups(&cluster.status(asked)).iter().filter(|g| ids(&g["replicas"]).contains(&node)).count()
}

/// Kills a node, starts it again once the repair moved one of its replicas (each learner's
/// catch-up held 4 s at its leader, so that the node returns mid-repair), and answers how many
/// of its groups it held before and holds once it has been back for longer than
/// `repair_after`, with the cluster and the volume.
fn return_mid_repair(env: &[(&str, &str)]) -> (Cluster, u64, usize, usize, u32, WriterLog) {
    let mut env = env.to_vec();
    env.push(("TUNDRA_TEST_CATCH_UP_DELAY_MS", "4000"));
    let (mut cluster, volume, log) = cluster_with("5s", &env);
    let dead = victim(&cluster);
    let up: Vec<u64> = (1..=4).filter(|&id| id != dead).collect();
    let held_before = held_by(&cluster, up[0], dead);
    assert!(held_before >= 3, "node {dead} holds two chunks and the redo group: {held_before}");
    cluster.kill9(dead);
    let started = Instant::now();
    loop {
        let repair = cluster.status(up[0])["manager"]["repair"].clone();
        if repair["moves_total"].as_u64().unwrap_or(0) >= 1 {
            break;
        }
        assert!(started.elapsed() < REPAIR_WAIT, "no repair: {repair:#}\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    cluster.start(dead);
    let started = Instant::now();
    loop {
        let manager = cluster.status(up[0])["manager"].clone();
        if ids(&manager["repair"]["repairing"]).is_empty() && manager["unknown_nodes"] == serde_json::json!([]) {
            break;
        }
        assert!(started.elapsed() < CATCH_UP_WAIT, "node {dead} still repaired: {manager:#}\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(200));
    }
    // More than repair_after with the node back.
    std::thread::sleep(WATCH + Duration::from_secs(2));
    let left = held_by(&cluster, up[0], dead);
    (cluster, dead, held_before, left, volume, log)
}

#[test]
fn a_node_that_returns_during_its_repair_is_repaired_no_further() {
    let (cluster, dead, held_before, left, volume, log) = return_mid_repair(&[]);
    assert!(
        left >= 1 && left < held_before,
        "node {dead} holds {left} of its {held_before} groups\n{}",
        cluster.logs()
    );
    repaired(&cluster, &[1, 2, 3, 4], 0, CATCH_UP_WAIT).unwrap_or_else(|why| panic!("{why}\n{}", cluster.logs()));
    let up: Vec<u64> = (1..=4).filter(|&id| id != dead).collect();
    let settled = shape(&cluster, up[0]);
    let started = Instant::now();
    while shape(&cluster, dead) != settled {
        assert!(started.elapsed() < CATCH_UP_WAIT, "node {dead}'s catalog did not catch up\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(300));
    }
    for id in 1..=4 {
        verify(&cluster, id, volume, &log).unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    }
}

#[test]
fn a_repair_that_ignores_a_returning_node_is_caught() {
    // The twin: with the hook the leader keeps repairing a node that reports again.
    let (cluster, dead, held_before, left, _, _) = return_mid_repair(&[("TUNDRA_TEST_REPAIR_RETURNED", "1")]);
    assert_eq!(left, 0, "node {dead} keeps {left} of its {held_before} groups\n{}", cluster.logs());
}
