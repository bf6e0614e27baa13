//! Volumes on a subset of a larger cluster, end to end: five `tundra serve` processes on
//! 127.0.0.1, a volume of three chunks created with `--replicas 3` whose chunks tundra-cluster's
//! placement spreads over the nodes, every page read back through every node (those holding no
//! replica of a chunk forward to its leader), `tundra cluster status` showing each node's
//! usage and the chunks it holds, and a volume the cluster cannot hold refused.

mod common;
#[path = "common/cluster.rs"]
mod common_cluster;

use std::collections::BTreeSet;

use common::{fails, succeeds};
use common_cluster::Cluster;
use tundra_proto::WriteMode;

/// Drives (sparse files) with room for three 1 GiB chunks each: placement counts a new chunk
/// at its whole logical size on both axes until the cluster has measured a ratio.
const DRIVE: &str = "physical = \"4GiB\"\nlogical = \"8GiB\"";
const PAGE: usize = 8192;
const PAGES_PER_CHUNK: u64 = (1 << 30) / PAGE as u64;

/// A page's content for a given write: its number and the write's, then text that compresses.
fn content(page: u64, write: u64) -> Vec<u8> {
    let mut bytes = format!("page {page} write {write} ").repeat(PAGE / 16).into_bytes();
    bytes.resize(PAGE, b'.');
    bytes
}

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
