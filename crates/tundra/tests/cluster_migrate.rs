//! Volumes on a subset of a larger cluster, end to end: five `tundra serve` processes on
//! 127.0.0.1, a volume of three chunks created with `--replicas 3` whose chunks tundra-cluster's
//! placement spreads over the nodes, every page read back through every node (those holding no
//! replica of a chunk forward to its leader), `tundra cluster status` showing each node's
//! usage and the chunks it holds, and a volume the cluster cannot hold refused. Chunk
//! migration: `tundra cluster drain` empties a node while a writer writes (every page then
//! reads back as the writer's log says, through every node), and a move whose target is
//! killed with kill -9 half way is rolled back or finished, nothing lost. With test-only hooks
//! that hold a learner's catch-up at its leader (`TUNDRA_TEST_CATCH_UP_DELAY_MS`,
//! `TUNDRA_TEST_CATCH_UP_LIMIT_MS`): a target killed before the voter change makes the move
//! roll back, and a source killed mid-move leaves a move that finishes when the source settles
//! it at its start; either way every catalog and group agree and every page reads back.

mod common;
#[path = "common/cluster.rs"]
mod common_cluster;
#[path = "common/links.rs"]
mod common_links;

use std::collections::BTreeSet;

use common::{fails, succeeds};
use common_cluster::{Cluster, WriterLog, page_content as content, verify_log as verify};
use tundra_proto::WriteMode;

/// Drives (sparse files) with room for three 1 GiB chunks each: placement counts a new chunk
/// at its whole logical size on both axes until the cluster has measured a ratio.
const DRIVE: &str = "physical = \"4GiB\"\nlogical = \"8GiB\"";
const PAGE: usize = 8192;
const PAGES_PER_CHUNK: u64 = (1 << 30) / PAGE as u64;

/// A page's content for a given write: its number and the write's, then text that compresses.
fn chunk_replicas(status: &serde_json::Value, volume: &str) -> Vec<BTreeSet<u64>> {
    status["chunks"]
        .as_array()
        .expect("chunks[]")
        .iter()
        .filter(|c| c["volume"] == volume)
        .map(|c| c["replicas"].as_array().expect("replicas").iter().map(|n| n.as_u64().expect("a node id")).collect())
        .collect()
}

#[test]
fn a_volume_on_three_of_five_nodes_is_placed_and_served_by_every_node() {
    let mut cluster = Cluster::of_size(5, |_| None, DRIVE);
    cluster.start_all();
    let addr = cluster.member(1).addr();
    succeeds(&["volume", "create", "sub", "--size", "2560MiB", "--replicas", "3", "--addr", &addr]);

    let status = cluster.status(2);
    let sets = chunk_replicas(&status, "sub");
    assert_eq!(sets.len(), 3, "{status:#}");
    for set in &sets {
        assert_eq!(set.len(), 3, "{status:#}");
    }
    // Placement counts the chunks placed before: the second chunk goes to the two nodes the
    // first left empty, so all five nodes hold a replica of something.
    let used: BTreeSet<u64> = sets.iter().flatten().copied().collect();
    assert_eq!(used.len(), 5, "{sets:?}");
    for node in status["nodes"].as_array().expect("nodes[]") {
        let id = node["id"].as_u64().expect("id");
        let held = node["chunks"].as_array().expect("chunks of a node").len();
        let placed = sets.iter().filter(|set| set.contains(&id)).count();
        assert_eq!(held, placed, "node {id} runs its placed replicas only: {status:#}");
        assert!(node["usage"]["logical_capacity_bytes"].as_u64().expect("capacity") >= 8 << 30, "{node}");
    }

    // Pages of every chunk written through node 1, read back through every node.
    let mut client = tundra_client::Client::connect(cluster.member(1).native).expect("connect");
    let volume = client.volume_lookup("sub").expect("lookup").id;
    let pages: Vec<u64> = (0..3).flat_map(|chunk| (0..4).map(move |i| chunk * PAGES_PER_CHUNK + i * 7)).collect();
    let pages: Vec<u64> = pages.into_iter().filter(|&p| p * (PAGE as u64) < 2560 << 20).collect();
    for &page in &pages {
        client.write_page(volume, page, WriteMode::Auto, &content(page, 1)).expect("write");
    }
    for id in 1..=5 {
        let mut reader = tundra_client::Client::connect(cluster.member(id).native).expect("connect");
        for &page in &pages {
            let read = reader.read_page(volume, page).expect("read");
            assert!(read == content(page, 1), "page {page} through node {id}");
        }
    }
    let status = cluster.status(3);
    let logical: u64 = status["nodes"]
        .as_array()
        .expect("nodes[]")
        .iter()
        .map(|n| n["usage"]["logical_used_bytes"].as_u64().expect("logical used"))
        .sum();
    assert_eq!(logical, (pages.len() * 3 * PAGE) as u64, "every page counted on its three replicas: {status:#}");

    fails(&["volume", "create", "six", "--size", "64MiB", "--replicas", "6", "--addr", &addr], "this cluster has 5");
    fails(&["volume", "create", "big", "--size", "3840MiB", "--replicas", "5", "--addr", &addr], "cannot hold");
}

/// Writes pages of both chunks through node `via` until `stop`, one at a time; returns its log.
fn writer(addr: std::net::SocketAddr, volume: u32, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) -> WriterLog {
    let pages: Vec<u64> = (0..32).chain((0..32).map(|i| PAGES_PER_CHUNK + i)).collect();
    write_pages(addr, volume, &pages, 0, stop)
}

/// Writes `pages` through node `via` until `stop`, one at a time, the writes numbered from
/// `first + 1`; returns its log.
fn write_pages(
    addr: std::net::SocketAddr,
    volume: u32,
    pages: &[u64],
    first: u64,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> WriterLog {
    let mut client = tundra_client::Client::connect(addr).expect("connect");
    let mut log = WriterLog::new();
    let mut write = first;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        write += 1;
        let page = pages[(write * 7) as usize % pages.len()];
        client.write_page(volume, page, WriteMode::Auto, &content(page, write)).expect("a write during the drain");
        log.insert(page, write);
    }
    log
}

fn node_of(status: &serde_json::Value, id: u64) -> &serde_json::Value {
    status["nodes"].as_array().expect("nodes[]").iter().find(|n| n["id"] == id).expect("the node")
}

#[test]
fn draining_a_node_under_writes_loses_nothing() {
    let mut cluster = Cluster::of_size(5, |_| None, DRIVE);
    cluster.start_all();
    succeeds(&["volume", "create", "d", "--size", "1536MiB", "--replicas", "3", "--addr", &cluster.member(1).addr()]);
    let volume =
        tundra_client::Client::connect(cluster.member(1).native).expect("connect").volume_lookup("d").expect("d").id;
    let status = cluster.status(1);
    let sets = chunk_replicas(&status, "d");
    // The node holding the most chunks is drained.
    let drained = (1..=5).max_by_key(|id| (sets.iter().filter(|s| s.contains(id)).count(), *id)).expect("a node");
    let via = if drained == 2 { 3 } else { 2 };

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writing = {
        let (addr, stop) = (cluster.member(via).native, stop.clone());
        std::thread::spawn(move || writer(addr, volume, stop))
    };
    std::thread::sleep(std::time::Duration::from_millis(500));
    let out = succeeds(&["cluster", "drain", &drained.to_string(), "--addr", &cluster.member(via).addr()]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains(&format!("node {drained} holds no chunk")), "{text}");
    std::thread::sleep(std::time::Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let log = writing.join().expect("the writer");
    assert!(log.len() > 10, "the writer wrote {} pages", log.len());

    for id in 1..=5 {
        verify(&cluster, id, volume, &log).unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    }
    // Twin: the check catches a page that does not hold the write the log names.
    let mut wrong = log.clone();
    *wrong.values_mut().next().expect("a page") += 1;
    assert!(verify(&cluster, via, volume, &wrong).is_err(), "the read-back check missed a wrong page");

    let status = cluster.status(via);
    let sets = chunk_replicas(&status, "d");
    assert_eq!(sets.len(), 2, "{status:#}");
    for set in &sets {
        assert_eq!(set.len(), 3, "{status:#}");
        assert!(!set.contains(&drained), "{status:#}");
    }
    let node = node_of(&status, drained);
    assert_eq!(node["chunks"].as_array().expect("chunks").len(), 0, "{status:#}");
    assert_eq!(node["usage"]["logical_used_bytes"], 0, "the drained node freed the pages: {status:#}");
    // Draining again has nothing to do.
    succeeds(&["cluster", "drain", &drained.to_string(), "--addr", &cluster.member(via).addr()]);
}

#[test]
fn a_move_whose_target_dies_is_rolled_back_or_finished() {
    let mut cluster = Cluster::of_size(4, |_| None, DRIVE);
    cluster.start_all();
    succeeds(&["volume", "create", "k", "--size", "64MiB", "--replicas", "3", "--addr", &cluster.member(1).addr()]);
    let mut client = tundra_client::Client::connect(cluster.member(1).native).expect("connect");
    let volume = client.volume_lookup("k").expect("k").id;
    let mut log = WriterLog::new();
    for page in 0..300 {
        client.write_page(volume, page, WriteMode::Auto, &content(page, 1)).expect("write");
        log.insert(page, 1);
    }
    let set = chunk_replicas(&cluster.status(1), "k").remove(0);
    let target = (1..=4).find(|id| !set.contains(id)).expect("a node outside the set");
    let source = *set.iter().next().expect("a replica");
    let asked = *set.iter().find(|&&id| id != source).expect("another replica");
    let mut mover = std::process::Command::new(env!("CARGO_BIN_EXE_tundra"))
        .args(["cluster", "move", "--volume", "k", "--chunk", "0", "--from", &source.to_string()])
        .args(["--to", &target.to_string(), "--addr", &cluster.member(asked).addr()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run tundra cluster move");
    // Kill the target as soon as it runs its replica.
    let started = std::time::Instant::now();
    while cluster.status(asked)["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .all(|n| n["id"] != target || n["chunks"].as_array().is_none_or(|c| c.is_empty()))
        && started.elapsed() < std::time::Duration::from_secs(10)
    {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    cluster.kill9(target);
    let moved = mover.wait().expect("the move ends").success();
    cluster.start(target);

    // Settled either way: three replicas in every catalog, the group run on exactly them.
    let started = std::time::Instant::now();
    let final_set = loop {
        let status = cluster.status(target);
        let sets = chunk_replicas(&status, "k");
        let runs: BTreeSet<u64> = status["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .filter(|n| n["chunks"].as_array().is_some_and(|c| !c.is_empty()))
            .map(|n| n["id"].as_u64().expect("id"))
            .collect();
        let agreed = (1..=4).all(|id| chunk_replicas(&cluster.status(id), "k") == sets);
        if sets[0].len() == 3 && runs == sets[0] && agreed {
            break sets[0].clone();
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(40), "not settled: {status:#}\n{}", cluster.logs());
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    println!("the move {}; replicas now {final_set:?} (were {set:?})", if moved { "finished" } else { "failed" });
    if moved {
        assert!(final_set.contains(&target) && !final_set.contains(&source), "{final_set:?}");
    } else {
        assert!(final_set == set || (final_set.contains(&target) && !final_set.contains(&source)), "{final_set:?}");
    }
    for id in 1..=4 {
        verify(&cluster, id, volume, &log).unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    }
}

/// A page's content that does not compress: the chunk's stored images are about the pages'
/// size, so its snapshot's extents take many pieces.
fn noise(page: u64, write: u64) -> Vec<u8> {
    let mut bytes = content(page, write);
    let mut x = page.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ write;
    for byte in bytes[64..].iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *byte = x as u8;
    }
    bytes
}

/// A chunk of thousands of incompressible pages (some 24 MiB of stored images, past the
/// 1,024 entries after which a chunk's log is purged behind a snapshot) moves to a new node:
/// the new replica cannot catch up from the log, so it receives the snapshot's extents in
/// pieces of 1 MiB and installs them; every page then reads back through every node.
#[test]
fn a_chunk_of_thousands_of_pages_moves_by_a_streamed_snapshot() {
    let pages: u64 = std::env::var("TUNDRA_MOVE_PAGES").ok().and_then(|v| v.parse().ok()).unwrap_or(3000);
    let mut cluster = Cluster::of_size(4, |_| None, DRIVE);
    cluster.start_all();
    succeeds(&["volume", "create", "big", "--size", "1GiB", "--replicas", "3", "--addr", &cluster.member(1).addr()]);
    let mut client = tundra_client::Client::connect(cluster.member(1).native).expect("connect");
    let volume = client.volume_lookup("big").expect("big").id;
    let mut log = WriterLog::new();
    for page in 0..pages {
        client.write_page(volume, page, WriteMode::Auto, &noise(page, 1)).expect("write");
        log.insert(page, 1);
    }
    let set = chunk_replicas(&cluster.status(1), "big").remove(0);
    let target = (1..=4).find(|id| !set.contains(id)).expect("a node outside the set");
    let source = *set.iter().next().expect("a replica");
    let asked = *set.iter().find(|&&id| id != source).expect("another replica");
    let started = std::time::Instant::now();
    succeeds(
        &["cluster", "move", "--volume", "big", "--chunk", "0", "--from", &source.to_string()]
            .into_iter()
            .chain(["--to", &target.to_string(), "--addr", &cluster.member(asked).addr()])
            .collect::<Vec<&str>>(),
    );
    println!("moved {pages} pages in {:.1} s", started.elapsed().as_secs_f64());
    let sets = chunk_replicas(&cluster.status(target), "big");
    assert!(sets[0].contains(&target) && !sets[0].contains(&source), "{sets:?}");
    // The move went by a snapshot: a replica captured one to send, and the target's stage is
    // gone once installed.
    let files = |id: u64, prefix: &str| -> usize {
        let dir = cluster.path().join(format!("node{id}")).join("snapshots");
        std::fs::read_dir(dir)
            .map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(prefix)).count())
            .unwrap_or(0)
    };
    assert!(set.iter().any(|&id| files(id, "send-") > 0), "no replica captured a snapshot to send");
    // The target holds the pages itself (reads through it could be forwarded to the leader),
    // and its stage is gone once installed.
    let waited = std::time::Instant::now();
    loop {
        let status = cluster.status(target);
        let held = node_of(&status, target)["usage"]["logical_used_bytes"].as_u64().expect("usage");
        let staged = files(target, "stage-");
        println!(
            "{:.1} s after the move: the target holds {held} bytes, {staged} stage(s)",
            waited.elapsed().as_secs_f64()
        );
        if held >= pages * PAGE as u64 && staged == 0 {
            break;
        }
        assert!(waited.elapsed() < std::time::Duration::from_secs(30), "{status:#}\n{}", cluster.logs());
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    for id in 1..=4 {
        let mut reader_of = tundra_client::Client::connect(cluster.member(id).native).expect("connect");
        for (&page, &write) in &log {
            let read = reader_of.read_page(volume, page).unwrap_or_else(|e| panic!("page {page} via {id}: {e}"));
            assert!(read == noise(page, write), "page {page} through node {id} differs\n{}", cluster.logs());
        }
    }
}

#[test]
fn a_drain_the_other_nodes_cannot_take_is_refused() {
    let mut cluster = Cluster::new(|_| None);
    cluster.start_all();
    let addr = cluster.member(1).addr();
    succeeds(&["volume", "create", "r", "--size", "16MiB", "--replicas", "3", "--addr", &addr]);
    // A drain moves the node's redo replicas first: three nodes leave none free to take one.
    fails(
        &["cluster", "drain", "3", "--addr", &addr],
        "no node can take node 3's replica of volume \"r\"'s redo stream: every other active node holds one",
    );
    fails(&["cluster", "drain", "9", "--addr", &addr], "node 9 is not a member");
    fails(
        &["cluster", "move", "--volume", "r", "--chunk", "0", "--from", "1", "--to", "2", "--addr", &addr],
        "already has a replica",
    );
    let status = cluster.status(2);
    assert_eq!(chunk_replicas(&status, "r"), vec![BTreeSet::from([1, 2, 3])], "{status:#}");
}

/// The settled state in every node's status: each catalog holds the same three replicas of
/// chunk 0 of `volume`, and exactly those nodes run its group (no move half done); the set.
fn settled_in(statuses: &[serde_json::Value], volume: &str) -> Option<BTreeSet<u64>> {
    let sets = chunk_replicas(&statuses[0], volume);
    let runs: BTreeSet<u64> = statuses[0]["nodes"]
        .as_array()?
        .iter()
        .filter(|n| n["chunks"].as_array().is_some_and(|c| !c.is_empty()))
        .map(|n| n["id"].as_u64().expect("id"))
        .collect();
    let agreed = statuses.iter().all(|status| chunk_replicas(status, volume) == sets);
    (sets.len() == 1 && sets[0].len() == 3 && runs == sets[0] && agreed).then(|| sets[0].clone())
}

/// Waits until [`settled_in`] holds; returns the set, and the statuses it held in.
fn settled(cluster: &Cluster, nodes: u64, volume: &str) -> (BTreeSet<u64>, Vec<serde_json::Value>) {
    settled_within(cluster, nodes, volume).unwrap_or_else(|e| panic!("{e}"))
}

/// [`settled`], or why not after 40 seconds.
fn settled_within(
    cluster: &Cluster,
    nodes: u64,
    volume: &str,
) -> Result<(BTreeSet<u64>, Vec<serde_json::Value>), String> {
    let started = std::time::Instant::now();
    loop {
        let statuses: Vec<serde_json::Value> = (1..=nodes).map(|id| cluster.status(id)).collect();
        if let Some(set) = settled_in(&statuses, volume) {
            return Ok((set, statuses));
        }
        if started.elapsed() > std::time::Duration::from_secs(40) {
            return Err(format!("not settled: {:#}\n{}", statuses[0], cluster.logs()));
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// A cluster of four whose leaders hold each learner's catch-up for `delay_ms` and give up on
/// it after `limit_ms` (test-only hooks), with volume `k` of 300 pages written; answers the
/// volume id, the writer's log and chunk 0's replicas.
fn held_catch_up_cluster(delay_ms: u64, limit_ms: u64) -> (Cluster, u32, WriterLog, BTreeSet<u64>) {
    let mut cluster = Cluster::of_size(4, |_| None, DRIVE);
    cluster.env = vec![
        ("TUNDRA_TEST_CATCH_UP_DELAY_MS".into(), delay_ms.to_string()),
        ("TUNDRA_TEST_CATCH_UP_LIMIT_MS".into(), limit_ms.to_string()),
    ];
    cluster.start_all();
    succeeds(&["volume", "create", "k", "--size", "64MiB", "--replicas", "3", "--addr", &cluster.member(1).addr()]);
    let mut client = tundra_client::Client::connect(cluster.member(1).native).expect("connect");
    let volume = client.volume_lookup("k").expect("k").id;
    let mut log = WriterLog::new();
    for page in 0..300 {
        client.write_page(volume, page, WriteMode::Auto, &content(page, 1)).expect("write");
        log.insert(page, 1);
    }
    let set = chunk_replicas(&cluster.status(1), "k").remove(0);
    (cluster, volume, log, set)
}

/// Starts `tundra cluster move` of chunk 0 of `k` and waits until `target` runs its replica
/// (the learner is being added; the leader holds its catch-up).
fn start_move(cluster: &Cluster, source: u64, target: u64, asked: u64) -> std::process::Child {
    let mover = std::process::Command::new(env!("CARGO_BIN_EXE_tundra"))
        .args(["cluster", "move", "--volume", "k", "--chunk", "0", "--from", &source.to_string()])
        .args(["--to", &target.to_string(), "--addr", &cluster.member(asked).addr()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run tundra cluster move");
    let started = std::time::Instant::now();
    while cluster.status(asked)["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .all(|n| n["id"] != target || n["chunks"].as_array().is_none_or(|c| c.is_empty()))
    {
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "the target never ran its replica");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    mover
}

#[test]
fn a_move_whose_target_dies_before_the_voter_change_is_rolled_back() {
    // The leader holds the catch-up for 3 s; the target is killed in that time, so the learner
    // never catches up, the move gives up after 4 s and rolls back.
    let (mut cluster, volume, log, set) = held_catch_up_cluster(3000, 4000);
    let target = (1..=4).find(|id| !set.contains(id)).expect("a node outside the set");
    let source = *set.iter().next().expect("a replica");
    let asked = *set.iter().find(|&&id| id != source).expect("another replica");
    let mover = start_move(&cluster, source, target, asked);
    cluster.kill9(target);
    let out = mover.wait_with_output().expect("the move ends");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "the move cannot finish without its target");
    assert!(stderr.contains("did not catch up"), "the rollback path ran: {stderr}");
    cluster.start(target);
    let (final_set, statuses) = settled(&cluster, 4, "k");
    assert_eq!(final_set, set, "rolled back to the old replicas");
    for id in 1..=4 {
        verify(&cluster, id, volume, &log).unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    }
    // Twins: the settled-state oracle fails on a target still running the rolled-back replica,
    // and on one node's catalog that kept the target.
    let mut running = statuses.clone();
    let node = running[0]["nodes"].as_array_mut().expect("nodes").iter_mut().find(|n| n["id"] == target);
    node.expect("the target")["chunks"] = serde_json::json!([{ "volume_id": volume, "chunk": 0 }]);
    assert!(settled_in(&running, "k").is_none(), "a replica left on the target passed as settled");
    let mut kept = statuses.clone();
    let chunk = kept[2]["chunks"].as_array_mut().expect("chunks").iter_mut().find(|c| c["volume"] == "k");
    chunk.expect("chunk 0")["replicas"].as_array_mut().expect("replicas").push(serde_json::json!(target));
    assert!(settled_in(&kept, "k").is_none(), "catalogs that disagree passed as settled");
    let mut bad = log.clone();
    *bad.values_mut().next().expect("a page") += 1;
    assert!(verify(&cluster, target, volume, &bad).is_err(), "the read-back check missed a wrong page");
}

#[test]
fn a_move_whose_source_dies_mid_move_finishes_and_converges() {
    let (mut cluster, volume, log, set) = held_catch_up_cluster(2000, 30_000);
    let target = (1..=4).find(|id| !set.contains(id)).expect("a node outside the set");
    let source = *set.iter().next().expect("a replica");
    let asked = *set.iter().find(|&&id| id != source).expect("another replica");
    let mover = start_move(&cluster, source, target, asked);
    cluster.kill9(source);
    let out = mover.wait_with_output().expect("the move ends");
    println!("the move answered: {} {}", out.status, String::from_utf8_lossy(&out.stderr));
    cluster.start(source);
    // The source settles the move when it starts: the target is a voter, so it finished.
    let (final_set, _) = settled(&cluster, 4, "k");
    assert!(final_set.contains(&target) && !final_set.contains(&source), "{final_set:?} (was {set:?})");
    for id in 1..=4 {
        verify(&cluster, id, volume, &log).unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    }
}

/// Moves chunk 0 of volume `b` back and forth between two nodes of four, each time to a node
/// that held it before: from a replica to the fourth node under a writer, back with the writer
/// paused (the returning node's old log then still matches the leader's, so a replica that
/// kept it would take entries after it and nothing before), and to the fourth node again under
/// the writer; then the node that holds it a second time is killed with kill -9 and restarted.
/// With `keep_log` (the twin's bug, `TUNDRA_TEST_FORGET_KEEPS_LOG`) dropped replicas keep
/// their Raft logs. Answers the first failure: a move refused, a cluster that did not settle on
/// the expected replicas, replicas that do not hold the same pages, or a page that does not
/// read as the writer's log says through some node.
const MOVE_BACK_PAGES: u64 = 1500;

fn move_back_and_forth(keep_log: bool) -> Result<(), String> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut cluster = Cluster::of_size(4, |_| None, DRIVE);
    if keep_log {
        cluster.env.push(("TUNDRA_TEST_FORGET_KEEPS_LOG".into(), "1".into()));
    }
    cluster.start_all();
    succeeds(&["volume", "create", "b", "--size", "64MiB", "--replicas", "3", "--addr", &cluster.member(1).addr()]);
    let mut client = tundra_client::Client::connect(cluster.member(1).native).expect("connect");
    let volume = client.volume_lookup("b").expect("b").id;
    // More writes than a group's log keeps before a snapshot purges it (a node's groups take
    // one every 1,024 entries and keep 256), so that every replica's log is purged when it is
    // dropped; the writer below rewrites a few of these pages only, so the others come from
    // the first history alone.
    let mut log = WriterLog::new();
    for page in 0..MOVE_BACK_PAGES {
        client.write_page(volume, page, WriteMode::Auto, &content(page, 1)).expect("write");
        log.insert(page, 1);
    }
    let set = chunk_replicas(&cluster.status(1), "b").remove(0);
    let target = (1..=4).find(|id| !set.contains(id)).expect("a node outside the set");
    let source = *set.iter().next().expect("a replica");
    let via = *set.iter().find(|&&id| id != source).expect("another replica");
    let (stop, paused) = (std::sync::Arc::new(AtomicBool::new(false)), std::sync::Arc::new(AtomicBool::new(false)));
    let writing = {
        let (addr, stop, paused) = (cluster.member(via).native, stop.clone(), paused.clone());
        std::thread::spawn(move || {
            let mut client = tundra_client::Client::connect(addr).expect("connect");
            let mut log = WriterLog::new();
            let mut write = 1u64;
            while !stop.load(Ordering::Relaxed) {
                if paused.load(Ordering::Relaxed) {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                    continue;
                }
                write += 1;
                let page = (write * 7) % 32;
                client.write_page(volume, page, WriteMode::Auto, &content(page, write)).expect("a write");
                log.insert(page, write);
            }
            log
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut expected = set.clone();
    let mut outcome = Ok(());
    for (from, to, writes) in [(source, target, true), (target, source, false), (source, target, true)] {
        paused.store(!writes, Ordering::Relaxed);
        std::thread::sleep(std::time::Duration::from_millis(100));
        let out = common::tundra(&[
            "cluster",
            "move",
            "--volume",
            "b",
            "--chunk",
            "0",
            "--from",
            &from.to_string(),
            "--to",
            &to.to_string(),
            "--addr",
            &cluster.member(via).addr(),
        ]);
        if !out.status.success() {
            outcome = Err(format!("the move from {from} to {to} failed: {}", String::from_utf8_lossy(&out.stderr)));
            break;
        }
        expected.remove(&from);
        expected.insert(to);
        outcome = match settled_within(&cluster, 4, "b") {
            Ok((now, _)) if now != expected => {
                Err(format!("after the move from {from} to {to} the replicas are {now:?}, not {expected:?}"))
            }
            Ok(_) => Ok(()),
            Err(why) => Err(why),
        };
        if outcome.is_err() {
            break;
        }
    }
    paused.store(false, Ordering::Relaxed);
    if outcome.is_ok() {
        cluster.kill9(target);
        cluster.start(target);
        outcome = match settled_within(&cluster, 4, "b") {
            Ok((now, _)) if now != expected => {
                Err(format!("after the restart the replicas are {now:?}, not {expected:?}"))
            }
            Ok(_) => Ok(()),
            Err(why) => Err(why),
        };
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    log.extend(writing.join().expect("the writer"));
    outcome?;
    // Every replica holds the chunk's pages once all caught up, the returning nodes too.
    let status = cluster.caught_up(via);
    for node in status["nodes"].as_array().expect("nodes[]") {
        let held =
            node["chunks"].as_array().into_iter().flatten().find(|c| c["volume_id"] == volume && c["chunk"] == 0);
        if let Some(chunk) = held {
            let bytes = chunk["logical_bytes"].as_u64();
            if bytes != Some(MOVE_BACK_PAGES * PAGE as u64) {
                return Err(format!(
                    "node {} holds {bytes:?} bytes of chunk 0, not {MOVE_BACK_PAGES} pages: {status:#}",
                    node["id"]
                ));
            }
        }
    }
    for id in 1..=4 {
        verify(&cluster, id, volume, &log)?;
    }
    Ok(())
}

#[test]
fn a_chunk_moves_back_to_nodes_that_held_it() {
    move_back_and_forth(false).unwrap_or_else(|e| panic!("{e}"));
}

/// Twin: dropped replicas that keep their Raft logs (as before a chunk could move back) make
/// the same run fail: the node taking the chunk back keeps its old log over an emptied store,
/// takes the entries after it and never the pages before.
#[test]
fn a_dropped_replica_that_keeps_its_log_is_caught() {
    let outcome = move_back_and_forth(true);
    println!("with the logs kept: {outcome:?}");
    assert!(outcome.is_err(), "moving back with stale logs passed the checks");
}
