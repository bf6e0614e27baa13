//! Growing a replicated volume (crates/tundra-member/src/resize.rs): `tundra volume resize`
//! through one node of three grows the volume on every node, within its last chunk and into
//! a new chunk placed by the manager; old pages read back as written, new ones are written
//! and read through every node, and a restart of every node keeps the size and the data. A
//! shrink, or a resize with a node down, is refused and changes nothing. A resize whose
//! coordinator stopped after growing the stores leaves every node serving the old size (a
//! write or a redo batch past it refused through every node) and is finished by running it
//! again. A volume that takes redo grows and takes redo in its new pages. The twin:
//! with the range checks on the store's size instead of the catalog's served size, a write
//! in the new range is taken while only one store grew.

mod common;
#[path = "common/cluster.rs"]
mod common_cluster;
#[path = "common/links.rs"]
mod common_links;

use std::time::Duration;

use common::{fails, succeeds};
use common_cluster::Cluster;
use serde_json::Value;
use tundra_client::Client;
use tundra_proto::{AppendOutcome, ReadAt, RedoAppend, WriteMode};
use tundra_redo::codec::encode_record;
use tundra_redo::{Payload, RedoRecord};
use tundra_store::ids::Lsn;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const PAGE: u64 = 8192;

/// Thin drives: a volume of a little over 1 GiB on 512 MiB drives (its pages are few).
fn cluster(env: &[(&str, &str)]) -> Cluster {
    let mut cluster = Cluster::with_drive(|_| None, "physical = \"512MiB\"\novercommit = true");
    cluster.env.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    cluster.start_all();
    cluster
}

fn create(cluster: &Cluster, name: &str, size: &str) {
    succeeds(&["volume", "create", name, "--size", size, "--replicas", "3", "--addr", &cluster.member(1).addr()]);
}

fn client(cluster: &Cluster, node: u64) -> Client {
    Client::connect(cluster.member(node).native).expect("connect")
}

/// A page's bytes: its number and a salt, repeated.
fn pattern(page: u64, salt: u8) -> Vec<u8> {
    (0..PAGE).map(|i| (page as u8).wrapping_mul(31) ^ (i as u8) ^ salt).collect()
}

fn write(cluster: &Cluster, node: u64, volume: &str, page: u64, salt: u8) -> Result<(), String> {
    let mut c = client(cluster, node);
    let id = c.volume_lookup(volume).expect("lookup").id;
    c.write_page(id, page, WriteMode::Auto, &pattern(page, salt)).map_err(|e| e.to_string())
}

fn read(cluster: &Cluster, node: u64, volume: &str, page: u64) -> Vec<u8> {
    let mut c = client(cluster, node);
    let id = c.volume_lookup(volume).expect("lookup").id;
    c.read_page(id, page).unwrap_or_else(|e| panic!("read page {page} through node {node}: {e}"))
}

/// A redo batch of one record (a whole image of `page` at LSN 1), the volume's first, appended
/// through node `node`.
fn append_first_redo(cluster: &Cluster, node: u64, volume: &str, page: u64) -> Result<AppendOutcome, String> {
    let mut c = client(cluster, node);
    let id = c.volume_lookup(volume).expect("lookup").id;
    let record = RedoRecord { lsn: Lsn(1), page, payload: Payload::Image(pattern(page, 9)) };
    let mut bytes = Vec::new();
    encode_record(&record, &mut bytes);
    let append = RedoAppend { volume: id, writer_epoch: 1, prev_lsn: 0, end_lsn: 1, record_count: 1, records: &bytes };
    c.append_redo(&append).map_err(|e| e.to_string())
}

/// The size node `node` serves for `volume`.
fn size_on(cluster: &Cluster, node: u64, volume: &str) -> u64 {
    client(cluster, node).volume_lookup(volume).expect("lookup").size_bytes
}

/// The size a new NBD connection to node `node` is told for `volume`.
fn nbd_size(cluster: &Cluster, node: u64, volume: &str) -> u64 {
    let out = std::process::Command::new("nbdinfo")
        .args(["--size", &cluster.member(node).uri(volume)])
        .output()
        .expect("nbdinfo");
    assert!(out.status.success(), "nbdinfo: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().parse().expect("nbdinfo --size prints a number")
}

fn resize(cluster: &Cluster, node: u64, volume: &str, size: &str) {
    succeeds(&["volume", "resize", volume, "--size", size, "--addr", &cluster.member(node).addr()]);
}

/// The replica sets `cluster status --json` shows for `volume`'s chunks, by chunk index.
fn chunk_replicas(status: &Value, volume: &str) -> Vec<(u64, Vec<u64>)> {
    let mut chunks: Vec<(u64, Vec<u64>)> = status["chunks"]
        .as_array()
        .expect("chunks")
        .iter()
        .filter(|c| c["volume"] == volume)
        .map(|c| {
            let index = c["chunk"].as_u64().or_else(|| c["index"].as_u64()).expect("a chunk index");
            let replicas = c["replicas"].as_array().expect("replicas").iter().filter_map(Value::as_u64).collect();
            (index, replicas)
        })
        .collect();
    chunks.sort();
    chunks
}

#[test]
fn a_replicated_volume_grows_within_its_chunk_and_into_a_new_one_on_every_node() {
    let mut cluster = cluster(&[]);
    create(&cluster, "v", "64MiB");
    let old_pages: Vec<u64> = (0..16).chain([64 * MIB / PAGE - 1]).collect();
    for &page in &old_pages {
        write(&cluster, 1, "v", page, 1).expect("write an old page");
    }

    // A shrink is refused, and nothing changes.
    let refused = fails(&["volume", "resize", "v", "--size", "32MiB", "--addr", &cluster.member(2).addr()], "shrink");
    println!("shrink: {refused}");
    // With a node down, refused with the node named, and nothing changes.
    cluster.stop(3);
    let refused =
        fails(&["volume", "resize", "v", "--size", "128MiB", "--addr", &cluster.member(1).addr()], "does not answer");
    assert!(refused.contains("node 3") && refused.contains("nothing was changed"), "{refused}");
    cluster.start(3);
    for node in 1..=3 {
        assert_eq!(size_on(&cluster, node, "v"), 64 * MIB, "node {node} changed size by a refused resize");
    }
    let past = write(&cluster, 2, "v", 64 * MIB / PAGE, 2).expect_err("a write past the end");
    println!("past the end: {past}");

    // Within the first chunk.
    resize(&cluster, 2, "v", "128MiB");
    let mid = 100 * MIB / PAGE;
    for node in 1..=3 {
        assert_eq!(size_on(&cluster, node, "v"), 128 * MIB, "node {node}");
        assert_eq!(nbd_size(&cluster, node, "v"), 128 * MIB, "the NBD export of node {node}");
        write(&cluster, node, "v", mid + node, 3).unwrap_or_else(|e| panic!("write through node {node}: {e}"));
    }
    for node in 1..=3 {
        for writer in 1..=3 {
            assert!(read(&cluster, node, "v", mid + writer) == pattern(mid + writer, 3), "node {node}");
        }
    }

    // Into a second chunk, placed by the manager.
    resize(&cluster, 3, "v", "1088MiB");
    let far = (GIB + 32 * MIB) / PAGE;
    for node in 1..=3 {
        assert_eq!(size_on(&cluster, node, "v"), GIB + 64 * MIB, "node {node}");
        write(&cluster, node, "v", far + node, 4)
            .unwrap_or_else(|e| panic!("write in chunk 1 through node {node}: {e}"));
    }
    let last = (GIB + 64 * MIB) / PAGE - 1;
    write(&cluster, 1, "v", last, 5).expect("the last page");
    write(&cluster, 1, "v", last + 1, 5).expect_err("a page past the new end");
    let chunks = chunk_replicas(&cluster.status(1), "v");
    println!("chunks: {chunks:?}");
    assert_eq!(chunks.len(), 2, "status shows both chunks: {chunks:?}");
    assert_eq!(chunks[1].0, 1);
    assert_eq!(chunks[1].1.len(), 3, "the new chunk has three replicas: {chunks:?}");
    // The manager learned the new chunk: two chunks, each on every node.
    let manager = &cluster.status(2)["manager"];
    assert_eq!(manager["chunks"], 2, "{manager}");
    for node in manager["nodes"].as_array().expect("the manager's nodes") {
        assert_eq!(node["chunks"], 2, "{manager}");
    }

    let check = |cluster: &Cluster, when: &str| {
        for node in 1..=3 {
            for &page in &old_pages {
                assert!(read(cluster, node, "v", page) == pattern(page, 1), "{when}: old page {page} via node {node}");
            }
            for writer in 1..=3 {
                assert!(read(cluster, node, "v", mid + writer) == pattern(mid + writer, 3), "{when}: node {node}");
                assert!(read(cluster, node, "v", far + writer) == pattern(far + writer, 4), "{when}: node {node}");
            }
            assert!(read(cluster, node, "v", last) == pattern(last, 5), "{when}: node {node}");
        }
    };
    check(&cluster, "after the resizes");

    // A restart of every node keeps the size and the data.
    for node in 1..=3 {
        cluster.stop(node);
    }
    cluster.start_all();
    for node in 1..=3 {
        assert_eq!(size_on(&cluster, node, "v"), GIB + 64 * MIB, "node {node} after a restart");
    }
    check(&cluster, "after a restart of every node");
    write(&cluster, 2, "v", far + 10, 6).expect("a write in chunk 1 after the restart");
    assert!(read(&cluster, 3, "v", far + 10) == pattern(far + 10, 6));
}

/// A redo batch of one record (a whole image of `page` at LSN `prev + 1`) appended through node
/// `node`.
fn append_redo_after(
    cluster: &Cluster,
    node: u64,
    volume: &str,
    prev: u64,
    page: u64,
) -> Result<AppendOutcome, String> {
    let mut c = client(cluster, node);
    let id = c.volume_lookup(volume).expect("lookup").id;
    let record = RedoRecord { lsn: Lsn(prev + 1), page, payload: Payload::Image(pattern(page, 9)) };
    let mut bytes = Vec::new();
    encode_record(&record, &mut bytes);
    let append =
        RedoAppend { volume: id, writer_epoch: 1, prev_lsn: prev, end_lsn: prev + 1, record_count: 1, records: &bytes };
    c.append_redo(&append).map_err(|e| e.to_string())
}

/// A replicated volume that takes redo grows: a redo batch naming a page of the new range is
/// taken through any node, and the page reads back at its LSN through every node, also after
/// every node restarted (each redo replica's stream, sized at its start, takes the new pages).
#[test]
fn a_replicated_volume_that_takes_redo_grows_and_takes_redo_in_its_new_pages() {
    let mut cluster = cluster(&[]);
    create(&cluster, "r", "64MiB");
    assert_eq!(append_first_redo(&cluster, 2, "r", 5), Ok(AppendOutcome::Ok { durable_lsn: 1 }));
    let far = 100 * MIB / PAGE;
    let refused = append_redo_after(&cluster, 1, "r", 1, far).expect_err("a page past the volume");
    println!("before the resize: {refused}");
    resize(&cluster, 1, "r", "128MiB");
    for node in 1..=3 {
        assert_eq!(size_on(&cluster, node, "r"), 128 * MIB, "node {node}");
    }
    assert_eq!(append_redo_after(&cluster, 3, "r", 1, far), Ok(AppendOutcome::Ok { durable_lsn: 2 }));
    assert_eq!(append_redo_after(&cluster, 1, "r", 2, 128 * MIB / PAGE - 1), Ok(AppendOutcome::Ok { durable_lsn: 3 }));
    let check = |cluster: &Cluster, when: &str| {
        for node in 1..=3 {
            let mut c = client(cluster, node);
            let id = c.volume_lookup("r").expect("lookup").id;
            for (page, lsn) in [(5, 1), (far, 2), (128 * MIB / PAGE - 1, 3)] {
                let at = ReadAt { request_lsn: 3, not_modified_since: 0, lease: None };
                let served =
                    c.get_page_at_lsn(id, page, at).unwrap_or_else(|e| panic!("{when}: page {page} via {node}: {e}"));
                assert_eq!(served.page_lsn, lsn, "{when}: page {page} via node {node}");
                assert!(
                    served.data == pattern(page, 9),
                    "{when}: page {page} via node {node} is not its record's image"
                );
            }
        }
    };
    check(&cluster, "after the resize");
    for node in 1..=3 {
        cluster.stop(node);
    }
    for node in 1..=3 {
        cluster.start(node);
    }
    check(&cluster, "after every node restarted");
}

#[test]
fn a_resize_whose_coordinator_stopped_after_growing_is_finished_by_running_it_again() {
    let mut cluster = cluster(&[("TUNDRA_TEST_RESIZE_STOP_AFTER_GROW", "all")]);
    create(&cluster, "v", "64MiB");
    write(&cluster, 1, "v", 3, 1).expect("write");
    let stopped = fails(
        &["volume", "resize", "v", "--size", "1088MiB", "--addr", &cluster.member(1).addr()],
        "coordinator stops here",
    );
    println!("{stopped}");
    // Stores grown, chunk 1 placed and led, and every node still serves 64 MiB: a write past it
    // is refused, naming the resize under way, through every node.
    let mid = 100 * MIB / PAGE;
    let far = (GIB + 32 * MIB) / PAGE;
    for node in 1..=3 {
        assert_eq!(size_on(&cluster, node, "v"), 64 * MIB, "node {node} serves the new size before phase 2");
        for page in [mid, far] {
            let refused = write(&cluster, node, "v", page, 2).expect_err("a write past the served size");
            assert!(refused.contains("resize"), "node {node}, page {page}: {refused}");
        }
    }
    println!("refused between the phases: {}", write(&cluster, 2, "v", far, 2).unwrap_err());
    assert_eq!(nbd_size(&cluster, 3, "v"), 64 * MIB, "a new NBD connection is told the old size");
    // Redo is refused between the phases too (a stream started now would take records past
    // the served size).
    let refused = append_first_redo(&cluster, 3, "v", far).expect_err("a redo batch between the phases");
    assert!(refused.contains("resize"), "{refused}");
    let refused = append_first_redo(&cluster, 1, "v", 2).expect_err("a redo batch between the phases");
    assert!(refused.contains("resize"), "{refused}");
    // A smaller size than the one under way is refused, naming it.
    let refused =
        fails(&["volume", "resize", "v", "--size", "128MiB", "--addr", &cluster.member(2).addr()], "under way");
    assert!(refused.contains(&(GIB + 64 * MIB).to_string()), "{refused}");

    // A node restarted between the phases comes up as it was: the old size served.
    cluster.stop(2);
    cluster.start(2);
    assert_eq!(size_on(&cluster, 2, "v"), 64 * MIB);
    assert!(write(&cluster, 2, "v", far, 2).is_err());

    // Run again (through a coordinator without the hook): finished.
    cluster.stop(1);
    cluster.env.clear();
    cluster.start(1);
    resize(&cluster, 1, "v", "1088MiB");
    for node in 1..=3 {
        assert_eq!(size_on(&cluster, node, "v"), GIB + 64 * MIB, "node {node}");
        write(&cluster, node, "v", far + node, 3).unwrap_or_else(|e| panic!("write through node {node}: {e}"));
    }
    for node in 1..=3 {
        assert!(read(&cluster, node, "v", 3) == pattern(3, 1), "the old page via node {node}");
        for writer in 1..=3 {
            assert!(read(&cluster, node, "v", far + writer) == pattern(far + writer, 3), "node {node}");
        }
    }
    assert_eq!(chunk_replicas(&cluster.status(3), "v").len(), 2);
}

/// Three nodes (with `range_from_store`, range checks on each store's size), a 64 MiB volume
/// resized to 128 MiB through the leader of its chunk, whose coordinator stops once that one
/// node grew: the cluster, the leader, and the outcome of a write at 100 MiB through it.
fn grown_on_the_leader_only(range_from_store: bool) -> (Cluster, u64, Result<(), String>) {
    let mut env = vec![("TUNDRA_TEST_RESIZE_STOP_AFTER_GROW", "1")];
    if range_from_store {
        env.push(("TUNDRA_TEST_RESIZE_RANGE_FROM_STORE", "1"));
    }
    let cluster = cluster(&env);
    create(&cluster, "v", "64MiB");
    write(&cluster, 1, "v", 0, 1).expect("write");
    let leader = cluster.leader(1, "v");
    let stopped =
        fails(&["volume", "resize", "v", "--size", "128MiB", "--addr", &cluster.member(leader).addr()], "stops here");
    assert!(stopped.contains(&format!("[{leader}]")), "only the coordinator grew: {stopped}");
    std::thread::sleep(Duration::from_millis(200));
    let outcome = write(&cluster, leader, "v", 100 * MIB / PAGE, 2);
    (cluster, leader, outcome)
}

#[test]
fn a_write_past_the_served_size_is_refused_while_only_some_stores_grew() {
    let (cluster, leader, outcome) = grown_on_the_leader_only(false);
    let refused = outcome.expect_err("a write in the new range while two stores had not grown");
    assert!(refused.contains("resize"), "{refused}");
    for node in (1..=3).filter(|&n| n != leader) {
        assert!(write(&cluster, node, "v", 100 * MIB / PAGE, 2).is_err(), "node {node} took the write");
    }
}

/// The twin: checking the range against the store's size, the leader (whose store grew) takes
/// the write while its followers' stores have not grown, and the replicas differ.
#[test]
fn with_range_checks_on_the_store_size_a_write_is_taken_before_every_store_grew() {
    let (mut cluster, leader, outcome) = grown_on_the_leader_only(true);
    assert!(
        outcome.is_ok(),
        "the store-size check refused the write through node {leader}: {outcome:?}\n{}",
        cluster.logs()
    );
    // The followers' stores refused that write when they applied it: once the resize finished
    // (every node restarted without the hooks) and another node leads, the acknowledged write
    // is gone.
    cluster.env.clear();
    for node in 1..=3 {
        cluster.stop(node);
        cluster.start(node);
    }
    resize(&cluster, 1, "v", "128MiB");
    let page = 100 * MIB / PAGE;
    cluster.stop(leader);
    let other = (1..=3).find(|&n| n != leader).expect("another node");
    assert!(
        read(&cluster, other, "v", page) != pattern(page, 2),
        "the write taken before every store grew reached the followers too"
    );
}

/// A resize abandoned once the manager placed its new chunk (and never run again) leaves that
/// chunk in the manager's state; deleting the volume forgets it with the others, so the
/// manager counts no chunk of a volume that is gone.
#[test]
fn deleting_a_volume_forgets_the_chunks_an_abandoned_resize_placed() {
    let cluster = cluster(&[("TUNDRA_TEST_RESIZE_STOP_AFTER_GROW", "0")]);
    create(&cluster, "v", "64MiB");
    let chunks_soon = |want: u64| {
        let started = std::time::Instant::now();
        loop {
            let status = cluster.status(1);
            let chunks = status["manager"]["chunks"].as_u64().expect("the manager's chunk count");
            if chunks == want {
                return;
            }
            assert!(
                started.elapsed() < std::time::Duration::from_secs(20),
                "the manager holds {chunks} chunks, not {want}: {status:#}"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    };
    chunks_soon(1);
    let stopped = fails(
        &["volume", "resize", "v", "--size", "1088MiB", "--addr", &cluster.member(1).addr()],
        "coordinator stops here",
    );
    println!("{stopped}");
    chunks_soon(2);
    succeeds(&["volume", "delete", "v", "--addr", &cluster.member(2).addr()]);
    chunks_soon(0);
}
