//! Repair of a bad page from a peer, end to end: three `tundra serve` processes, a replicated
//! volume written with incompressible pages (stored raw, so their bytes can be found in a drive
//! image whose own compression is off), one follower stopped, a byte of one page flipped in its
//! `drive.img`, the node restarted with a fast scrub, and its stats then show the page found
//! bad by the scrub and repaired from a peer; every page reads back as written through it, and
//! its drive image holds the page's good bytes again. And with the scrub off: a page gone bad
//! on two replicas, one of which leads, is repaired by a read through the leader from the
//! third.

mod common;
#[path = "common/cluster.rs"]
mod common_cluster;
#[path = "common/links.rs"]
mod common_links;

use std::time::{Duration, Instant};

use common::succeeds;
use common_cluster::Cluster;
use tundra_env::Rng;
use tundra_proto::WriteMode;

const PAGE: usize = 8192;
const PAGES: u64 = 16;
/// How long the restarted node's scrub may take to find and repair the page.
const REPAIR_WAIT: Duration = Duration::from_secs(60);

fn page_content(page: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; PAGE];
    Rng::new(0x7e9a_1400 + page).fill(&mut bytes);
    bytes
}

/// Where `needle` starts in `haystack`, every time.
fn find_all(haystack: &[u8], needle: &[u8]) -> Vec<usize> {
    haystack.windows(needle.len()).enumerate().filter(|(_, w)| *w == needle).map(|(at, _)| at).collect()
}

#[test]
fn a_page_gone_bad_on_a_stopped_replica_is_repaired_from_a_peer_by_the_scrub() {
    let mut cluster = Cluster::with_drive(|_| None, "physical = \"256MiB\"\ncompression = \"off\"");
    cluster.start_all();
    succeeds(&["volume", "create", "rv", "--size", "16MiB", "--replicas", "3", "--addr", &cluster.member(1).addr()]);
    let mut client = tundra_client::Client::connect(cluster.member(1).native).expect("connect");
    let volume = client.volume_lookup("rv").expect("lookup").id;
    for page in 0..PAGES {
        client.write_page(volume, page, WriteMode::Auto, &page_content(page)).expect("write");
    }
    drop(client);
    cluster.caught_up(1);

    // A follower goes down and one of its pages goes bad on its drive meanwhile. It is stopped
    // (SIGTERM), not killed: a replica applies committed entries without a store sync, and a
    // restart after a kill applies them again from its Raft log, writing page 5 afresh (then
    // there is nothing to repair). A stop closes its stores, so the damaged blocks are the
    // page's only copy on its drive, and the restart must not read them (a start that
    // captured the chunk's snapshot did, and failed).
    let leader = cluster.leader(1, "rv");
    let bad_node = (1..=3).find(|&id| id != leader).expect("a follower");
    cluster.stop(bad_node);
    let image = cluster.path().join(format!("node{bad_node}")).join("drive.img");
    let mut bytes = std::fs::read(&image).expect("read the drive image");
    let block = &page_content(5)[..4096];
    let places = find_all(&bytes, block);
    assert!(!places.is_empty(), "page 5 is not in node {bad_node}'s drive image as written");
    for &at in &places {
        bytes[at + 100] ^= 0x10;
    }
    // The last check below would fail without a repair: no good copy is left on this drive.
    assert!(find_all(&bytes, block).is_empty(), "page 5's good bytes are still on node {bad_node}'s drive");
    std::fs::write(&image, &bytes).expect("write the drive image");
    drop(bytes);

    let mut config = std::fs::read_to_string(&cluster.member(bad_node).config).expect("config");
    config.push_str("scrub_pages_per_sec = 1000\n");
    std::fs::write(&cluster.member(bad_node).config, config).expect("config");
    cluster.start(bad_node);

    let started = Instant::now();
    let repair = loop {
        let repair = cluster.status(bad_node)["repair"].clone();
        if repair["pages_repaired"].as_u64().is_some_and(|n| n >= 1) {
            break repair;
        }
        assert!(started.elapsed() < REPAIR_WAIT, "no repair on node {bad_node}: {repair}\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(repair["bad_found_by_scrub"].as_u64().is_some_and(|n| n >= 1), "{repair}");
    assert_eq!(repair["unrepairable"], 0, "{repair}");

    let mut client = tundra_client::Client::connect(cluster.member(bad_node).native).expect("connect");
    for page in 0..PAGES {
        assert!(client.read_page(volume, page).expect("read") == page_content(page), "page {page} differs");
    }
    drop(client);
    cluster.kill9(bad_node);
    let bytes = std::fs::read(&image).expect("read the drive image");
    assert!(!find_all(&bytes, block).is_empty(), "node {bad_node}'s drive holds no good copy of page 5");
}

/// Flips a byte of page `page`'s first block wherever it lies in node `id`'s drive image (the
/// node is stopped), and checks no good copy of that block is left there.
fn corrupt_on(cluster: &Cluster, id: u64, page: u64) {
    let image = cluster.path().join(format!("node{id}")).join("drive.img");
    let mut bytes = std::fs::read(&image).expect("read the drive image");
    let block = &page_content(page)[..4096];
    let places = find_all(&bytes, block);
    assert!(!places.is_empty(), "page {page} is not in node {id}'s drive image as written");
    for &at in &places {
        bytes[at + 200] ^= 0x01;
    }
    assert!(find_all(&bytes, block).is_empty());
    std::fs::write(&image, &bytes).expect("write the drive image");
}

#[test]
fn a_read_through_a_leader_whose_page_went_bad_repairs_it_from_a_peer() {
    let mut cluster = Cluster::with_drive(|_| None, "physical = \"256MiB\"\ncompression = \"off\"");
    for id in 1..=3 {
        let mut config = std::fs::read_to_string(&cluster.member(id).config).expect("config");
        config.push_str("scrub_pages_per_sec = 0\n");
        std::fs::write(&cluster.member(id).config, config).expect("config");
    }
    cluster.start_all();
    succeeds(&["volume", "create", "rv", "--size", "16MiB", "--replicas", "3", "--addr", &cluster.member(1).addr()]);
    let mut client = tundra_client::Client::connect(cluster.member(1).native).expect("connect");
    let volume = client.volume_lookup("rv").expect("lookup").id;
    for page in 0..PAGES {
        client.write_page(volume, page, WriteMode::Auto, &page_content(page)).expect("write");
    }
    drop(client);
    cluster.caught_up(1);

    // Page 9 goes bad on nodes 1 and 2 (stopped, so that the damaged blocks are the page's
    // durable copies: see the test above); node 3 keeps the one good copy.
    cluster.stop(1);
    cluster.stop(2);
    corrupt_on(&cluster, 1, 9);
    corrupt_on(&cluster, 2, 9);
    cluster.start(1);
    cluster.start(2);
    let mut leader = cluster.leader(3, "rv");
    if leader == 3 {
        // The good replica leads: it goes down so that a bad one leads, then comes back to
        // serve its copy.
        cluster.kill9(3);
        leader = cluster.leader(1, "rv");
        while leader == 3 {
            std::thread::sleep(Duration::from_millis(100));
            leader = cluster.leader(1, "rv");
        }
        cluster.start(3);
    }
    assert_ne!(leader, 3);

    let mut client = tundra_client::Client::connect(cluster.member(leader).native).expect("connect");
    for page in 0..PAGES {
        assert!(client.read_page(volume, page).expect("read") == page_content(page), "page {page} differs");
    }
    let repair = cluster.status(leader)["repair"].clone();
    assert!(cluster.leader(leader, "rv") == leader, "leadership moved during the reads: {repair}");
    assert!(repair["bad_found_by_reads"].as_u64().is_some_and(|n| n >= 1), "{repair}\n{}", cluster.logs());
    assert!(repair["pages_repaired"].as_u64().is_some_and(|n| n >= 1), "{repair}");
    assert_eq!(repair["pages_scrubbed"], 0, "{repair}");
}
