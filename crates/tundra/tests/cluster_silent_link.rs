//! A peer cut off by a partition counts as out of reach although its connection stays up:
//! three `tundra serve` processes whose peer links run through the proxies of
//! common/links.rs, which hold a cut link's bytes (as a partition does to TCP) rather than close
//! it. A leader captures a chunk to send a follower only while the follower is in reach, and a
//! follower behind a cut that kept its connection counted as in reach. `cluster status` says
//! what the answering node's transport thinks of each peer (`nodes[].linked`); the twin
//! (`TUNDRA_TEST_LINKED_BY_CONNECTION`) counts a connection as reach and must see the cut
//! peer still linked.

mod common;
#[path = "common/cluster.rs"]
mod common_cluster;
#[path = "common/links.rs"]
mod common_links;

use std::time::{Duration, Instant};

use common::succeeds;
use common_cluster::Cluster;
use common_links::Cut;

/// The transport's silence before a peer counts as out of reach (tundra-member's `SILENCE`),
/// and a margin.
const SILENCE_AND_MARGIN: Duration = Duration::from_secs(5 + 3);

/// What node `asked` says of its link to `peer`.
fn linked(cluster: &Cluster, asked: u64, peer: u64) -> Option<bool> {
    let status = cluster.status(asked);
    let nodes = status["nodes"].as_array().expect("nodes").clone();
    nodes.iter().find(|n| n["id"] == peer).and_then(|n| n["linked"].as_bool())
}

/// Waits up to 30 s for node `asked` to say `peer` is linked.
fn until_linked(cluster: &Cluster, asked: u64, peer: u64) {
    let started = Instant::now();
    while linked(cluster, asked, peer) != Some(true) {
        assert!(started.elapsed() < Duration::from_secs(30), "node {asked} never linked node {peer}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Nodes 1 and 2 cut off from each other both ways for longer than the silence: what node 1
/// says of node 2 then. The link is healed and node 1 must say node 2 is linked again.
fn linked_during_a_cut(env: &[(&str, &str)]) -> Option<bool> {
    let mut cluster = Cluster::with_faulty_links(|_| None);
    cluster.env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    cluster.start_all();
    succeeds(&["volume", "create", "rv", "--size", "16MiB", "--replicas", "3", "--addr", &cluster.member(1).addr()]);
    until_linked(&cluster, 1, 2);
    assert_eq!(linked(&cluster, 1, 1), None, "a node says nothing of a link to itself");
    let links = cluster.links.as_ref().expect("the cluster's proxies");
    links.cut(1, 2, Cut::Both);
    std::thread::sleep(SILENCE_AND_MARGIN);
    let during = linked(&cluster, 1, 2);
    // Node 3 still hears node 1: the cut is of one link only.
    assert_eq!(linked(&cluster, 1, 3), Some(true), "node 1 lost node 3 too");
    cluster.links.as_ref().expect("proxies").heal();
    until_linked(&cluster, 1, 2);
    during
}

#[test]
fn a_peer_behind_a_cut_that_keeps_its_connection_is_out_of_reach() {
    assert_eq!(
        linked_during_a_cut(&[]),
        Some(false),
        "node 2, cut off for longer than the silence, still counts as in reach"
    );
}

#[test]
fn counting_a_connection_as_reach_is_caught() {
    let during = linked_during_a_cut(&[("TUNDRA_TEST_LINKED_BY_CONNECTION", "1")]);
    assert_eq!(during, Some(true), "with the connection counted as reach, the cut peer should still be linked");
}
