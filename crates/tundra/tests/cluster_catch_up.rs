//! A follower that fell behind catches up in appends of about a mebibyte each: three `tundra
//! serve` processes, a replicated volume, one follower stopped while the leader takes hundreds
//! of incompressible pages, then started again; once it holds every entry, the leader's largest
//! Raft message is within the cap. openraft alone bounds an append by its count of entries
//! (300), so the same catch-up sent messages of megabytes: on a loaded machine one took longer
//! to cross than the transport waits for an answer, was sent again behind itself, and two nodes
//! left with a dead third stopped answering each other. The twin lifts the cap
//! (`TUNDRA_TEST_APPEND_BYTES`) and must see a message over it.

mod common;
#[path = "common/cluster.rs"]
mod common_cluster;
#[path = "common/links.rs"]
mod common_links;

use common::succeeds;
use common_cluster::Cluster;
use tundra_env::Rng;
use tundra_proto::WriteMode;

const PAGE: usize = 8192;
/// Pages written while the follower is down: each its own entry of a little over 8 KiB, about
/// 4.9 MB in all, fewer entries than make the leader build a snapshot (1,024), so the follower
/// catches up from the log.
const PAGES: u64 = 600;
/// The cap on an append's entries (tundra-raft's `APPEND_BYTES`) and what the message adds.
const CAP: u64 = 1 << 20;
const SLACK: u64 = 64 << 10;

/// The leader's largest Raft message after a follower caught up on `PAGES` pages, and its
/// Raft bytes sent meanwhile; `env` is every node's.
fn catch_up(env: &[(&str, &str)]) -> (u64, u64) {
    let mut cluster = Cluster::with_drive(|_| None, "physical = \"256MiB\"\ncompression = \"off\"");
    cluster.env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    cluster.start_all();
    succeeds(&["volume", "create", "rv", "--size", "16MiB", "--replicas", "3", "--addr", &cluster.member(1).addr()]);
    cluster.caught_up(1);
    let leader = cluster.leader(1, "rv");
    let follower = (1..=3).find(|&id| id != leader).expect("a follower");
    cluster.stop(follower);

    let mut client = tundra_client::Client::connect(cluster.member(leader).native).expect("connect");
    let volume = client.volume_lookup("rv").expect("lookup").id;
    let mut bytes = vec![0u8; PAGE];
    for page in 0..PAGES {
        Rng::new(0xca7c_0000 + page).fill(&mut bytes);
        client.write_page(volume, page, WriteMode::Auto, &bytes).expect("write");
    }
    drop(client);
    let sent_before = cluster.status(leader)["traffic"]["raft_bytes_sent"].as_u64().expect("traffic");
    cluster.start(follower);
    let status = cluster.caught_up(leader);
    let largest = status["traffic"]["largest_raft_message_sent"].as_u64().expect("largest message");
    let sent = status["traffic"]["raft_bytes_sent"].as_u64().expect("traffic") - sent_before;
    (largest, sent)
}

#[test]
fn a_follower_behind_catches_up_in_appends_within_the_cap() {
    let (largest, sent) = catch_up(&[]);
    println!("largest Raft message {largest} bytes; {sent} Raft bytes sent during the catch-up");
    // The catch-up did send the pages, in messages large enough that the cap mattered.
    assert!(sent >= PAGES * PAGE as u64, "the catch-up sent {sent} bytes for {PAGES} pages");
    assert!(largest > CAP / 2, "no message came near the cap ({largest} bytes): the test measured nothing");
    assert!(largest <= CAP + SLACK, "a Raft message of {largest} bytes, over the cap of {CAP}");
}

#[test]
fn appends_without_the_cap_are_caught() {
    let (largest, _) = catch_up(&[("TUNDRA_TEST_APPEND_BYTES", "1073741824")]);
    println!("without the cap: largest Raft message {largest} bytes");
    assert!(largest > CAP + SLACK, "without the cap the largest message was {largest} bytes: the check cannot fail");
}
