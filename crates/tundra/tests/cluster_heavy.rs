//! Heavy compression of a replicated volume (seed 000 §3.2.3) over the native protocol, asked of
//! any node: each chunk's leader reads the range, compresses each segment once and proposes it,
//! and every replica stores the same segment. A writer rewrites pages of the range meanwhile,
//! and keeps every write (a segment takes only pages still at the version it names). Every
//! page then reads back as the writer's log says through every node, every replica holds the
//! same heavy pages, and so after the chunk's leader is killed and after it restarts.

mod common;
#[path = "common/cluster.rs"]
mod common_cluster;
#[path = "common/links.rs"]
mod common_links;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::succeeds;
use common_cluster::{Cluster, WriterLog, page_content as content, verify_log as verify};
use tundra_proto::WriteMode;

const PAGES: u64 = 512;

/// Heavy pages of volume `id` in node `node`'s own store (its replica).
fn heavy_pages_on(cluster: &Cluster, node: u64, id: u32) -> u64 {
    let mut client = tundra_client::Client::connect(cluster.member(node).native).expect("connect");
    let stats: serde_json::Value = serde_json::from_str(&client.stats(Some(id)).expect("stats")).expect("JSON");
    stats["heavy_pages"].as_u64().unwrap_or_else(|| panic!("no heavy_pages in {stats:#}"))
}

/// Waits until every node's replica holds the same number of heavy pages; returns it.
fn same_heavy_pages_everywhere(cluster: &Cluster, id: u32) -> u64 {
    let started = Instant::now();
    loop {
        let counts: Vec<u64> = (1..=3).map(|node| heavy_pages_on(cluster, node, id)).collect();
        if counts.iter().all(|&c| c == counts[0]) {
            return counts[0];
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "replicas hold {counts:?} heavy pages\n{}",
            cluster.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_replicated_volume_is_heavily_compressed_by_its_leaders_and_every_replica_stores_it() {
    let mut cluster = Cluster::new(|_| None);
    cluster.start_all();
    succeeds(&["volume", "create", "h", "--size", "64MiB", "--replicas", "3", "--addr", &cluster.member(1).addr()]);
    let mut client = tundra_client::Client::connect(cluster.member(1).native).expect("connect");
    let id = client.volume_lookup("h").expect("lookup").id;
    let mut log = WriterLog::new();
    for page in 0..PAGES {
        client.write_page(id, page, WriteMode::Auto, &content(page, 1)).expect("write");
        log.insert(page, 1);
    }

    // A writer rewrites pages of the range through node 3 while node 2 asks for the range's
    // heavy compression.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (addr, stop) = (cluster.member(3).native, stop.clone());
        std::thread::spawn(move || {
            let mut client = tundra_client::Client::connect(addr).expect("connect");
            let mut written = WriterLog::new();
            let mut write = 1;
            while !stop.load(Ordering::Relaxed) {
                write += 1;
                let page = (write * 37) % PAGES;
                client.write_page(id, page, WriteMode::Auto, &content(page, write)).expect("a write during heavy");
                written.insert(page, write);
            }
            written
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let mut asker = tundra_client::Client::connect(cluster.member(2).native).expect("connect");
    let report = asker.heavy_compress(id, 0, PAGES).expect("heavy compression of a replicated volume");
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().expect("the writer");
    println!(
        "heavy: {} pages in {} segments, {} bytes before, {} after; {} writes beside it",
        report.pages,
        report.segments,
        report.bytes_before,
        report.bytes_after,
        written.len()
    );
    assert!(report.pages > 0 && report.segments > 0, "{report:?}");
    assert!(report.bytes_after < report.bytes_before, "{report:?}");
    assert!(!written.is_empty(), "the writer wrote nothing beside the heavy compression");
    log.extend(written);

    for node in 1..=3 {
        verify(&cluster, node, id, &log).unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    }
    let heavy = same_heavy_pages_everywhere(&cluster, id);
    assert!(heavy > 0, "no replica holds a heavy page");
    println!("every replica holds {heavy} heavy pages");
    // Twin of the read-back check: one page named at a write it never had is caught.
    let mut wrong = log.clone();
    *wrong.values_mut().next().expect("a page") += 1000;
    assert!(verify(&cluster, 1, id, &wrong).is_err(), "the read-back check missed a wrong page");

    // The chunk's leader killed: the pages read back through a survivor, and the restarted
    // node holds the same heavy pages once caught up.
    let leader = cluster.leader(1, "h");
    cluster.kill9(leader);
    let survivor = (1..=3).find(|&n| n != leader).expect("a survivor");
    verify(&cluster, survivor, id, &log).unwrap_or_else(|e| panic!("after the leader's kill: {e}\n{}", cluster.logs()));
    cluster.start(leader);
    assert_eq!(same_heavy_pages_everywhere(&cluster, id), heavy, "after the restart");
    verify(&cluster, leader, id, &log)
        .unwrap_or_else(|e| panic!("through the restarted node: {e}\n{}", cluster.logs()));

    // Compressed again with no writer: the pages the writer wrote since are taken too, and
    // then every page of the range is heavy on every replica.
    let mut asker = tundra_client::Client::connect(cluster.member(survivor).native).expect("connect");
    let again = asker.heavy_compress(id, 0, PAGES).expect("heavy compression again");
    println!("again: {again:?}");
    assert_eq!(same_heavy_pages_everywhere(&cluster, id), PAGES, "after a second pass with no writer");
    for node in 1..=3 {
        verify(&cluster, node, id, &log).unwrap_or_else(|e| panic!("after the second pass: {e}\n{}", cluster.logs()));
    }
}
