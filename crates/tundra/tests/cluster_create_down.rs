//! Replicated volumes created while nodes are down (issue 15), with real processes on
//! 127.0.0.1: four `tundra serve`, one or two of them killed with kill -9.
//!
//! - Node 4 killed and counted unknown by the manager: a volume of three replicas is created
//!   on nodes 1 to 3 and reads back through each of them. Node 4 started again adopts it from
//!   its peers' catalogs: it lists it, reads every page back, writes through it, and its
//!   status shows the volume's chunks. Then node 3 is killed and another volume is created:
//!   its id differs from the first's. The twin: with the catalog catch-up off
//!   (`TUNDRA_TEST_CATCH_UP=off`) node 4 never lists the volume, and the check fails.
//! - Node 4 holds a node-local volume with the id the creation gives (made before it went
//!   down): back up, it refuses to adopt the replicated volume, says so in `cluster status`,
//!   and its own volume reads back as it was. The twin (`TUNDRA_TEST_ADOPT_UNCHECKED=1`: no
//!   check) adopts it, and the local volume's pages read back as the replicated volume's.
//! - Nodes 3 and 4 killed: no majority answers, the creation is refused with a clear error,
//!   and no node has the volume.
//! - A cluster whose node 4 has never started: the manager builds its state from the nodes
//!   that answer, the volume is placed on nodes 1 to 3, and node 4, started at last, adopts it.

mod common;
#[path = "common/cluster.rs"]
mod common_cluster;
#[path = "common/links.rs"]
mod common_links;

use std::time::{Duration, Instant};

use common::{fails, succeeds};
use common_cluster::Cluster;
use tundra_proto::WriteMode;

/// Drives with room for two 1 GiB chunks each (placement counts a new chunk at its whole size).
const DRIVE: &str = "physical = \"4GiB\"\nlogical = \"8GiB\"";
const PAGE: usize = 8192;
const PAGES_PER_CHUNK: u64 = (1 << 30) / PAGE as u64;
/// How long the manager may take to count a killed node unknown (its report stale after 5 s).
const UNKNOWN_WAIT: Duration = Duration::from_secs(30);
/// How long a returning node may take to adopt a volume (its first catch-up 3 s after start,
/// retried every 2 s while too few peers answer).
const ADOPT_WAIT: Duration = Duration::from_secs(25);
/// How long the twins wait for what never comes.
const TWIN_WAIT: Duration = Duration::from_secs(12);

fn content(tag: &str, page: u64) -> Vec<u8> {
    let mut bytes = format!("{tag} page {page} ").repeat(PAGE / 16).into_bytes();
    bytes.resize(PAGE, b'.');
    bytes
}

/// The pages each test writes: some of both chunks.
fn pages() -> Vec<u64> {
    (0..8).chain((0..8).map(|i| PAGES_PER_CHUNK + i * 5)).collect()
}

fn four(env: &[(&str, &str)]) -> Cluster {
    let mut cluster = Cluster::of_size(4, |_| None, DRIVE);
    cluster.env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    cluster.start_all();
    // A running cluster: every node has reported to the manager before any is killed.
    let started = Instant::now();
    loop {
        let manager = cluster.status(1)["manager"].clone();
        let reported = manager["nodes"].as_array().map_or(0, Vec::len);
        if reported == 4 && manager["unknown_nodes"] == serde_json::json!([]) {
            return cluster;
        }
        assert!(started.elapsed() < UNKNOWN_WAIT, "the manager never listed the 4 nodes: {manager:#}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Kills node `id` and waits until the manager (asked of node `asked`) counts it unknown.
fn kill_and_wait_unknown(cluster: &mut Cluster, id: u64, asked: u64) {
    cluster.kill9(id);
    let started = Instant::now();
    loop {
        let status = cluster.status(asked);
        let unknown = status["manager"]["unknown_nodes"].as_array().cloned().unwrap_or_default();
        if unknown.iter().any(|n| n.as_u64() == Some(id)) {
            return;
        }
        assert!(
            started.elapsed() < UNKNOWN_WAIT,
            "node {id} never unknown: {:#}\n{}",
            status["manager"],
            cluster.logs()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn create(cluster: &Cluster, name: &str, via: u64) -> u32 {
    succeeds(&["volume", "create", name, "--size", "2GiB", "--replicas", "3", "--addr", &cluster.member(via).addr()]);
    let mut client = tundra_client::Client::connect(cluster.member(via).native).expect("connect");
    client.volume_lookup(name).expect("lookup").id
}

/// Every page of `pages` read through node `id` holds `content(tag, page)`.
fn verify(cluster: &Cluster, id: u64, name: &str, tag: &str, pages: &[u64]) -> Result<(), String> {
    let mut client = tundra_client::Client::connect(cluster.member(id).native).map_err(|e| e.to_string())?;
    let volume = client.volume_lookup(name).map_err(|e| format!("{name:?} through node {id}: {e}"))?.id;
    for &page in pages {
        let read = client.read_page(volume, page).map_err(|e| format!("page {page} through node {id}: {e}"))?;
        if read != content(tag, page) {
            let head = String::from_utf8_lossy(&read[..read.len().min(40)]).into_owned();
            return Err(format!("page {page} of {name:?} through node {id} is {head:?}, not {tag:?}"));
        }
    }
    Ok(())
}

fn write(cluster: &Cluster, via: u64, name: &str, tag: &str, pages: &[u64]) {
    let mut client = tundra_client::Client::connect(cluster.member(via).native).expect("connect");
    let volume = client.volume_lookup(name).expect("lookup").id;
    for &page in pages {
        client.write_page(volume, page, WriteMode::Auto, &content(tag, page)).expect("write");
    }
}

fn ids(value: &serde_json::Value) -> Vec<u64> {
    value.as_array().map_or(Vec::new(), |a| a.iter().filter_map(serde_json::Value::as_u64).collect())
}

/// The chunks of volume `name` as node `asked`'s status shows them.
fn chunks_of(cluster: &Cluster, asked: u64, name: &str) -> Vec<serde_json::Value> {
    let status = cluster.status(asked);
    status["chunks"].as_array().map_or(Vec::new(), |a| a.iter().filter(|c| c["volume"] == name).cloned().collect())
}

fn listed(cluster: &Cluster, id: u64, name: &str) -> bool {
    let out = succeeds(&["volume", "list", "--addr", &cluster.member(id).addr()]);
    String::from_utf8_lossy(&out.stdout).lines().any(|line| line.split('\t').next() == Some(name))
}

/// The oracle of adoption: within `wait`, node 4 lists volume "v", reads every page back as
/// written, and its status shows the volume's two chunks, each with a leader.
fn adopted(cluster: &Cluster, pages: &[u64], wait: Duration) -> Result<(), String> {
    let started = Instant::now();
    loop {
        let why = if !listed(cluster, 4, "v") {
            "node 4 does not list \"v\"".to_string()
        } else {
            match verify(cluster, 4, "v", "v", pages) {
                Err(why) => why,
                Ok(()) => {
                    let chunks = chunks_of(cluster, 4, "v");
                    if chunks.len() == 2 && chunks.iter().all(|c| c["leader"].is_u64()) {
                        return Ok(());
                    }
                    format!("node 4's status shows chunks {chunks:?}")
                }
            }
        };
        if started.elapsed() >= wait {
            return Err(format!("not adopted after {wait:?}: {why}"));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Node 4 down, a volume created on nodes 1 to 3 and written; node 4 started again.
fn created_with_node_4_down(cluster: &mut Cluster) -> u32 {
    kill_and_wait_unknown(cluster, 4, 1);
    let id = create(cluster, "v", 1);
    for chunk in chunks_of(cluster, 1, "v") {
        assert_eq!(ids(&chunk["replicas"]), vec![1, 2, 3], "placed on the up nodes: {chunk}");
    }
    write(cluster, 1, "v", "v", &pages());
    for node in 1..=3 {
        verify(cluster, node, "v", "v", &pages()).unwrap();
    }
    cluster.start(4);
    id
}

#[test]
fn a_volume_created_with_a_node_down_is_learned_when_it_returns() {
    let mut cluster = four(&[]);
    let id = created_with_node_4_down(&mut cluster);
    adopted(&cluster, &pages(), ADOPT_WAIT).unwrap_or_else(|why| panic!("{why}\n{}", cluster.logs()));
    // Writes through the returning node reach the groups: read back through node 1.
    let more: Vec<u64> = (100..104).collect();
    write(&cluster, 4, "v", "v", &more);
    verify(&cluster, 1, "v", "v", &more).unwrap();
    verify(&cluster, 4, "v", "v", &more).unwrap();
    // Another node down, another volume: another id, placed on the up nodes.
    kill_and_wait_unknown(&mut cluster, 3, 1);
    let other = create(&cluster, "w", 4);
    assert_ne!(other, id, "two volumes created with different nodes down share an id");
    for chunk in chunks_of(&cluster, 1, "w") {
        assert!(!ids(&chunk["replicas"]).contains(&3), "placed on a down node: {chunk}");
    }
    write(&cluster, 2, "w", "w", &pages());
    verify(&cluster, 4, "w", "w", &pages()).unwrap();
}

#[test]
fn twin_without_the_catch_up_the_returning_node_never_learns_the_volume() {
    let mut cluster = four(&[("TUNDRA_TEST_CATCH_UP", "off")]);
    created_with_node_4_down(&mut cluster);
    let result = adopted(&cluster, &pages(), TWIN_WAIT);
    assert!(result.is_err(), "the oracle must catch a node that never learns the volume");
    assert!(!listed(&cluster, 4, "v"));
}

/// The oracle of the conflict: node 4 refuses volume "v" (status says so), does not serve it,
/// and its local volume "local" reads back as written.
fn refused(cluster: &Cluster, wait: Duration) -> Result<(), String> {
    let started = Instant::now();
    loop {
        let status = cluster.status(4);
        let refusals = status["refused_volumes"].as_array().cloned().unwrap_or_default();
        let said = refusals.iter().any(|r| r.as_str().is_some_and(|r| r.contains("\"v\"") && r.contains("\"local\"")));
        let local = verify(cluster, 4, "local", "local", &[0, 1, 2]);
        let serves_v = tundra_client::Client::connect(cluster.member(4).native)
            .map_err(|e| e.to_string())
            .and_then(|mut c| c.volume_lookup("v").map_err(|e| e.to_string()))
            .is_ok();
        match local {
            Ok(()) if said && !serves_v => return Ok(()),
            _ if started.elapsed() >= wait => {
                return Err(format!(
                    "refusals {refusals:?}, the local volume {local:?}, node 4 serves \"v\": {serves_v}"
                ));
            }
            Err(why) => return Err(format!("the local volume is damaged: {why}")),
            Ok(()) => std::thread::sleep(Duration::from_millis(300)),
        }
    }
}

/// Node 4 holds a local volume with the id the replicated volume gets; answers the oracle.
fn conflict(env: &[(&str, &str)], wait: Duration) -> (Cluster, Result<(), String>) {
    let mut cluster = four(env);
    let node4 = cluster.member(4).addr();
    succeeds(&["volume", "create", "local", "--size", "64MiB", "--addr", &node4]);
    write(&cluster, 4, "local", "local", &[0, 1, 2]);
    let local_id = tundra_client::Client::connect(cluster.member(4).native).unwrap().volume_lookup("local").unwrap().id;
    kill_and_wait_unknown(&mut cluster, 4, 1);
    let id = create(&cluster, "v", 1);
    assert_eq!(id, local_id, "the test needs the replicated volume to take the local volume's id");
    write(&cluster, 1, "v", "v", &[0, 1, 2]);
    cluster.start(4);
    // The first catch-up passes 3 s after the start.
    std::thread::sleep(Duration::from_secs(5));
    let result = refused(&cluster, wait);
    (cluster, result)
}

#[test]
fn a_returning_node_with_a_clashing_local_volume_refuses_to_adopt() {
    let (cluster, result) = conflict(&[], ADOPT_WAIT);
    result.unwrap_or_else(|why| panic!("{why}\n{}", cluster.logs()));
    assert!(cluster.member(4).log_text().contains("refuses to adopt the replicated volume \"v\""));
    let out = succeeds(&["cluster", "status", "--addr", &cluster.member(4).addr()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("refused volume"), "the text status says it");
    verify(&cluster, 1, "v", "v", &[0, 1, 2]).unwrap();
}

#[test]
fn twin_without_the_check_the_local_volume_reads_as_another() {
    let (_cluster, result) = conflict(&[("TUNDRA_TEST_ADOPT_UNCHECKED", "1")], TWIN_WAIT);
    let why = result.expect_err("the oracle must catch a local volume served wrong");
    assert!(why.contains("damaged") || why.contains("serves"), "{why}");
}

#[test]
fn without_a_majority_nothing_is_created() {
    let mut cluster = four(&[]);
    cluster.kill9(3);
    cluster.kill9(4);
    let error = fails(
        &["volume", "create", "v", "--size", "2GiB", "--replicas", "3", "--addr", &cluster.member(1).addr()],
        "majority",
    );
    assert!(error.contains("nothing was created"), "{error}");
    for node in 1..=2 {
        assert!(!listed(&cluster, node, "v"), "node {node} has the refused volume");
        assert!(chunks_of(&cluster, node, "v").is_empty());
    }
}

/// A cluster whose node 4 has never started: the manager builds its state from the three
/// nodes that answer (node 4 holds no replica yet), a volume is placed on them, and node 4,
/// started at last, enters the manager's state with its first report and adopts the volume.
#[test]
fn a_cluster_started_with_a_node_never_up_creates_volumes() {
    let mut cluster = Cluster::of_size(4, |_| None, DRIVE);
    for id in 1..=3 {
        cluster.start(id);
    }
    let started = Instant::now();
    loop {
        let addr = cluster.member(1).addr();
        let out = common::tundra(&["volume", "create", "v", "--size", "2GiB", "--replicas", "3", "--addr", &addr]);
        if out.status.success() {
            break;
        }
        assert!(
            started.elapsed() < UNKNOWN_WAIT,
            "never created: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            cluster.logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    for chunk in chunks_of(&cluster, 1, "v") {
        assert_eq!(ids(&chunk["replicas"]), vec![1, 2, 3], "placed on the nodes up: {chunk}");
    }
    write(&cluster, 1, "v", "v", &pages());
    cluster.start(4);
    adopted(&cluster, &pages(), ADOPT_WAIT).unwrap_or_else(|why| panic!("{why}\n{}", cluster.logs()));
    let started = Instant::now();
    while cluster.status(1)["manager"]["nodes"].as_array().map_or(0, Vec::len) < 4 {
        assert!(started.elapsed() < UNKNOWN_WAIT, "node 4 never entered the manager's state");
        std::thread::sleep(Duration::from_millis(300));
    }
}
