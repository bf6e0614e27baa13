//! Deleting a replicated volume (crates/tundra-member/src/delete.rs): `tundra volume delete`
//! through one node of three removes the volume from every node, frees its space on the
//! nodes that held its replicas, leaves the other volumes as they were, survives a restart,
//! and lets the name be used again; with two nodes of three down nothing is deleted; with one
//! down the others delete it and the node finishes the delete once it is back (its twin, with
//! that node's catalog catch-up ignoring deletes, keeps the volume); a delete whose
//! coordinator stopped once every node was marked is finished by the nodes themselves (and
//! its twin, with that upkeep off, shows the check would catch a delete left half done).

mod common;
#[path = "common/cluster.rs"]
mod common_cluster;
#[path = "common/links.rs"]
mod common_links;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{fails, realdata_heap, succeeds};
use common_cluster::{Cluster, nbdcopy};
use serde_json::Value;

/// How long the nodes have to finish a marked delete by themselves (their upkeep looks every
/// 2 s).
const FINISH_WAIT: Duration = Duration::from_secs(20);

/// About 4 MiB of a PostgreSQL heap when there is one (compressible, as a database's pages
/// are), else of the tundra binary.
fn some_file(dir: &Path) -> PathBuf {
    let bytes = match realdata_heap(1 << 20) {
        Some((_, bytes)) => bytes[..bytes.len().min(4 << 20)].to_vec(),
        None => {
            let binary = std::fs::read(env!("CARGO_BIN_EXE_tundra")).expect("read the tundra binary");
            binary[..binary.len().min(4 << 20)].to_vec()
        }
    };
    let path = dir.join("input.file");
    std::fs::write(&path, bytes).expect("write the input");
    path
}

fn read_back(cluster: &Cluster, node: u64, volume: &str, name: &str, len: usize) -> Vec<u8> {
    let out = cluster.path().join(name);
    nbdcopy(&[&cluster.member(node).uri(volume), out.to_str().expect("utf-8 path")]);
    let mut bytes = std::fs::read(&out).expect("read back");
    bytes.truncate(len);
    bytes
}

fn create(cluster: &Cluster, name: &str) {
    succeeds(&["volume", "create", name, "--size", "16MiB", "--replicas", "3", "--addr", &cluster.member(1).addr()]);
}

/// The volume names `tundra volume list --json` shows on node `id`.
fn listed(cluster: &Cluster, id: u64) -> Vec<String> {
    let out = succeeds(&["volume", "list", "--json", "--addr", &cluster.member(id).addr()]);
    let list: Value = serde_json::from_slice(&out.stdout).expect("volume list --json is JSON");
    let volumes = list.as_array().or_else(|| list["volumes"].as_array()).expect("a list of volumes");
    volumes.iter().map(|v| v["name"].as_str().expect("a name").to_string()).collect()
}

/// Node `asked`'s `tundra cluster status --json` once every node's usage is in it (a node that
/// answers its status late, on a loaded machine, shows none), asked again for up to 30 s.
fn status_with_every_usage(cluster: &Cluster, asked: u64) -> Value {
    let started = Instant::now();
    loop {
        let status = cluster.status(asked);
        let nodes = status["nodes"].as_array().cloned().unwrap_or_default();
        if !nodes.is_empty() && nodes.iter().all(|n| n["usage"]["physical_used_bytes"].is_u64()) {
            return status;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "a node's usage stays missing: {status:#}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Every node's drive physical usage, from `tundra cluster status --json`.
fn physical_used(status: &Value) -> Vec<(u64, u64)> {
    status["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| (n["id"].as_u64().expect("id"), n["usage"]["physical_used_bytes"].as_u64().expect("physical used")))
        .collect()
}

/// `Ok` once no node lists `volume` and no node's status shows a chunk of it.
fn gone_everywhere(cluster: &Cluster, volume: &str) -> Result<(), String> {
    for id in 1..=3 {
        if listed(cluster, id).iter().any(|v| v == volume) {
            return Err(format!("node {id} still lists volume {volume}"));
        }
    }
    let status = cluster.status(1);
    if status["chunks"].as_array().expect("chunks").iter().any(|c| c["volume"] == volume) {
        return Err(format!("status still shows chunks of {volume}: {status:#}"));
    }
    Ok(())
}

fn wait_gone(cluster: &Cluster, volume: &str, within: Duration) -> Result<(), String> {
    let started = Instant::now();
    loop {
        match gone_everywhere(cluster, volume) {
            Ok(()) => return Ok(()),
            Err(why) if started.elapsed() > within => return Err(why),
            Err(_) => std::thread::sleep(Duration::from_millis(250)),
        }
    }
}

#[test]
fn a_replicated_volume_is_deleted_from_every_node_and_its_space_freed() {
    let mut cluster = Cluster::new(|_| None);
    cluster.start_all();
    let file = some_file(cluster.path());
    let original = std::fs::read(&file).expect("read the input");
    create(&cluster, "keep");
    create(&cluster, "gone");
    nbdcopy(&["--flush", file.to_str().expect("utf-8"), &cluster.member(1).uri("keep")]);
    nbdcopy(&["--flush", file.to_str().expect("utf-8"), &cluster.member(1).uri("gone")]);
    let before = physical_used(&status_with_every_usage(&cluster, 1));

    // With two nodes of three down nothing is deleted: the volume still takes writes afterwards.
    cluster.stop(2);
    cluster.stop(3);
    let refused = fails(&["volume", "delete", "gone", "--addr", &cluster.member(1).addr()], "do not answer");
    assert!(refused.contains("nothing was deleted") && refused.contains("[2, 3]"), "{refused}");
    cluster.start(2);
    cluster.start(3);
    for id in 1..=3 {
        assert!(listed(&cluster, id).iter().any(|v| v == "gone"), "node {id} lost volume gone to a refused delete");
    }
    nbdcopy(&["--flush", file.to_str().expect("utf-8"), &cluster.member(3).uri("gone")]);

    // With one down, the two others delete it; node 3 finishes once it is back.
    cluster.stop(3);
    let started = Instant::now();
    succeeds(&["volume", "delete", "gone", "--addr", &cluster.member(2).addr()]);
    println!("deleted through node 2, node 3 down, in {:.2} s", started.elapsed().as_secs_f64());
    for id in 1..=2 {
        assert!(!listed(&cluster, id).iter().any(|v| v == "gone"), "node {id} still lists volume gone");
    }
    cluster.start(3);
    let started = Instant::now();
    wait_gone(&cluster, "gone", FINISH_WAIT).unwrap_or_else(|why| panic!("{why}\n{}", cluster.logs()));
    println!("node 3 finished the delete {:.2} s after its start", started.elapsed().as_secs_f64());

    // Each node held a replica of every chunk of `gone` (three replicas on three nodes): each
    // frees what the volume's pages cost it (checked below, after a restart).
    let after = physical_used(&status_with_every_usage(&cluster, 1));
    for ((id, was), (_, now)) in before.iter().zip(&after) {
        println!("node {id}: physical used {was} before, {now} after");
    }
    let keep_read = read_back(&cluster, 3, "keep", "keep-1", original.len());
    assert!(keep_read == original, "volume keep changed when volume gone was deleted");

    // A delete of a volume already gone is a clear error, and nothing else changes.
    fails(&["volume", "delete", "gone", "--addr", &cluster.member(1).addr()], "gone");

    // A restart brings nothing of it back.
    cluster.stop(1);
    cluster.start(1);
    gone_everywhere(&cluster, "gone").unwrap_or_else(|why| panic!("after a restart: {why}"));
    let keep_read = read_back(&cluster, 1, "keep", "keep-2", original.len());
    assert!(keep_read == original, "volume keep changed across the restart");

    // The space: measured after the restart too (a delete trims the freed blocks).
    let freed = physical_used(&status_with_every_usage(&cluster, 2));
    for ((id, was), (_, now)) in before.iter().zip(&freed) {
        assert!(now < was, "node {id} freed nothing: physical used {was} before the delete, {now} after");
    }

    // The name can be used again: a new, empty volume.
    create(&cluster, "gone");
    let fresh = read_back(&cluster, 2, "gone", "fresh", 1 << 20);
    assert!(fresh.iter().all(|&b| b == 0), "the new volume named gone shows the old one's bytes");
}

/// The twin of a returning node's delete: with the nodes' catalog catch-up ignoring what
/// their peers deleted, node 3, down during the delete, keeps the volume, and the check above
/// sees it.
#[test]
fn without_the_catch_up_learning_deletes_a_node_down_during_one_keeps_the_volume() {
    let mut cluster = Cluster::new(|_| None);
    cluster.env.push(("TUNDRA_TEST_CATCH_UP_IGNORES_DELETES".into(), "1".into()));
    cluster.start_all();
    create(&cluster, "v");
    cluster.stop(3);
    succeeds(&["volume", "delete", "v", "--addr", &cluster.member(1).addr()]);
    cluster.start(3);
    let left = wait_gone(&cluster, "v", Duration::from_secs(10));
    assert!(left.is_err(), "the check saw the volume gone with nothing to tell node 3 of the delete");
    assert!(listed(&cluster, 3).iter().any(|v| v == "v"), "{left:?}");
}

/// Starts three nodes whose delete coordinator stops once every node is marked, with the
/// nodes' own finishing on or off, creates and writes volume `v`, and runs the delete.
fn delete_stopped_after_marking(upkeep: bool) -> Cluster {
    let mut cluster = Cluster::new(|_| None);
    cluster.env.push(("TUNDRA_TEST_DELETE_STOP_AFTER_MARK".into(), "1".into()));
    if !upkeep {
        cluster.env.push(("TUNDRA_TEST_DELETE_NO_UPKEEP".into(), "1".into()));
    }
    cluster.start_all();
    let file = some_file(cluster.path());
    create(&cluster, "v");
    nbdcopy(&["--flush", file.to_str().expect("utf-8"), &cluster.member(1).uri("v")]);
    fails(&["volume", "delete", "v", "--addr", &cluster.member(3).addr()], "marked deleting on every node");
    // Marked everywhere: the volume takes no I/O through any node.
    let out = Command::new("nbdcopy")
        .args([file.to_str().expect("utf-8"), &cluster.member(1).uri("v")])
        .output()
        .expect("nbdcopy");
    assert!(!out.status.success(), "a volume marked deleting took a write");
    cluster
}

#[test]
fn a_delete_whose_coordinator_stopped_after_marking_is_finished_by_every_node() {
    let cluster = delete_stopped_after_marking(true);
    wait_gone(&cluster, "v", FINISH_WAIT).unwrap_or_else(|why| panic!("{why}\n{}", cluster.logs()));
}

/// The twin: with the nodes' own finishing off, the same check finds the volume still there.
#[test]
fn without_the_nodes_finishing_a_marked_delete_it_stays_half_done() {
    let cluster = delete_stopped_after_marking(false);
    let left = wait_gone(&cluster, "v", Duration::from_secs(8));
    assert!(left.is_err(), "the check saw the volume gone with nothing to finish the delete");
}
