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

/// Volume `h` of 64 MiB with three replicas, its first [`PAGES`] pages written once through
/// node 1: a client of node 1, the volume's id and the writes' log.
fn written(cluster: &Cluster) -> (tundra_client::Client, u32, WriterLog) {
    succeeds(&["volume", "create", "h", "--size", "64MiB", "--replicas", "3", "--addr", &cluster.member(1).addr()]);
    let mut client = tundra_client::Client::connect(cluster.member(1).native).expect("connect");
    let id = client.volume_lookup("h").expect("lookup").id;
    let mut log = WriterLog::new();
    for page in 0..PAGES {
        client.write_page(id, page, WriteMode::Auto, &content(page, 1)).expect("write");
        log.insert(page, 1);
    }
    (client, id, log)
}

#[test]
fn a_replicated_volume_is_heavily_compressed_by_its_leaders_and_every_replica_stores_it() {
    let mut cluster = Cluster::new(|_| None);
    cluster.start_all();
    let (_, id, mut log) = written(&cluster);

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

/// `tundra fsck --json` of node `id`'s data directory (the node is stopped).
fn fsck(cluster: &Cluster, id: u64) -> serde_json::Value {
    let config = cluster.member(id).config.to_str().expect("utf-8").to_string();
    let out = common::tundra(&["fsck", "--config", &config, "--json"]);
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("fsck --json: {e}: {}", String::from_utf8_lossy(&out.stderr)))
}

/// Flips a byte in the middle of the frame of every heavy segment in a drive image whose own
/// compression is off (a 16-byte header of frame length, page count, two zero bytes and a
/// nonce, then zstd's frame magic); answers how many.
fn corrupt_heavy_segments(image: &std::path::Path) -> usize {
    const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
    let mut bytes = std::fs::read(image).expect("read the drive image");
    let starts: Vec<usize> =
        bytes.windows(4).enumerate().filter(|(at, w)| *at >= 16 && *w == ZSTD_MAGIC).map(|(at, _)| at - 16).collect();
    let mut found = 0;
    for at in starts {
        let frame_len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        let pages = u16::from_le_bytes(bytes[at + 4..at + 6].try_into().expect("2 bytes"));
        if bytes[at + 16..at + 20] == ZSTD_MAGIC
            && bytes[at + 6..at + 8] == [0, 0]
            && (1..=64).contains(&pages)
            && frame_len > 8
            && at + 16 + frame_len <= bytes.len()
        {
            bytes[at + 16 + frame_len / 2] ^= 0x40;
            found += 1;
        }
    }
    std::fs::write(image, &bytes).expect("write the drive image");
    found
}

/// Heavy segments gone bad on a stopped follower are repaired from a peer by its scrub, every
/// page of each segment at once: `tundra fsck` of its data directory finds pages bad before
/// (the damage is real) and none after.
#[test]
fn heavy_segments_gone_bad_on_a_replica_are_repaired_from_a_peer_by_its_scrub() {
    let mut cluster = Cluster::with_drive(|_| None, "physical = \"256MiB\"\ncompression = \"off\"");
    for id in 1..=3 {
        let mut config = std::fs::read_to_string(&cluster.member(id).config).expect("config");
        config.push_str("scrub_pages_per_sec = 0\n");
        std::fs::write(&cluster.member(id).config, config).expect("config");
    }
    cluster.start_all();
    let (mut client, id, log) = written(&cluster);
    let report = client.heavy_compress(id, 0, PAGES).expect("heavy compression");
    assert_eq!(report.pages, PAGES, "{report:?}");
    drop(client);
    cluster.caught_up(1);

    // A follower stopped (its stores closed, so the damaged blocks are its segments' only
    // copies) and every heavy segment on its drive damaged.
    let leader = cluster.leader(1, "h");
    let bad = (1..=3).find(|&n| n != leader).expect("a follower");
    cluster.stop(bad);
    let damaged = corrupt_heavy_segments(&cluster.path().join(format!("node{bad}")).join("drive.img"));
    assert!(damaged >= report.segments as usize, "{damaged} segments found on node {bad}'s drive, {report:?}");
    let before = fsck(&cluster, bad);
    assert_eq!(before["clean"].as_bool(), Some(false), "the damage did not show: {before:#}");
    println!("node {bad}: {damaged} segments damaged; fsck before: {}", before["problem"]);

    let config = std::fs::read_to_string(&cluster.member(bad).config).expect("config");
    let config = config.replace("scrub_pages_per_sec = 0\n", "scrub_pages_per_sec = 1000\n");
    std::fs::write(&cluster.member(bad).config, config).expect("config");
    cluster.start(bad);
    let started = Instant::now();
    let repair = loop {
        let repair = cluster.status(bad)["repair"].clone();
        if repair["pages_repaired"].as_u64().is_some_and(|n| n >= PAGES) {
            break repair;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "no repair on node {bad}: {repair}\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(200));
    };
    println!("node {bad}: {repair}");
    assert!(repair["bad_found_by_scrub"].as_u64().is_some_and(|n| n >= report.segments), "{repair}");
    assert_eq!(repair["unrepairable"], 0, "{repair}\n{}", cluster.logs());
    for node in 1..=3 {
        verify(&cluster, node, id, &log).unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    }
    cluster.stop(bad);
    let after = fsck(&cluster, bad);
    assert_eq!(after["clean"].as_bool(), Some(true), "node {bad} after the repair: {after:#}");
}

/// A chunk holding heavy segments moves to a fourth node by a snapshot (its log purged behind
/// one: more than 1,024 entries since the segments): the segments travel as stored, and the
/// target holds every heavy page itself, which `tundra fsck` of its data directory verifies.
#[test]
fn a_chunk_of_heavy_segments_moves_by_a_snapshot_and_its_target_holds_them() {
    let mut cluster = Cluster::of_size(4, |_| None, "physical = \"512MiB\"");
    cluster.start_all();
    let (mut client, id, mut log) = written(&cluster);
    // Through the command line this time; a range past the volume's end is refused first.
    let addr = cluster.member(3).addr();
    let refused =
        common::fails(&["volume", "heavy-compress", "h", "--first", "8192", "--addr", &addr], "has 8192 pages");
    println!("{refused}");
    let pages = PAGES.to_string();
    let out = succeeds(&["volume", "heavy-compress", "h", "--count", &pages, "--json", "--addr", &addr]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("heavy-compress --json is JSON");
    assert_eq!(report["pages"].as_u64(), Some(PAGES), "{report:#}");
    assert!(report["bytes_after"].as_u64() < report["bytes_before"].as_u64(), "{report:#}");
    // More than a snapshot's worth of entries after the segments, on other pages.
    for page in PAGES..PAGES + 1100 {
        client.write_page(id, page, WriteMode::Auto, &content(page, 1)).expect("write");
        log.insert(page, 1);
    }
    drop(client);
    let status = cluster.status(1);
    let set: Vec<u64> = status["chunks"].as_array().expect("chunks")[0]["replicas"]
        .as_array()
        .expect("replicas")
        .iter()
        .filter_map(serde_json::Value::as_u64)
        .collect();
    let target = (1..=4).find(|id| !set.contains(id)).expect("a node outside the set");
    let source = set[0];
    let asked = set[1];
    let (from, to) = (source.to_string(), target.to_string());
    succeeds(&[
        "cluster",
        "move",
        "--volume",
        "h",
        "--chunk",
        "0",
        "--from",
        &from,
        "--to",
        &to,
        "--addr",
        &cluster.member(asked).addr(),
    ]);
    let sent = set.iter().any(|&node| {
        std::fs::read_dir(cluster.path().join(format!("node{node}")).join("snapshots"))
            .map(|d| d.flatten().any(|e| e.file_name().to_string_lossy().starts_with("send-")))
            .unwrap_or(false)
    });
    assert!(sent, "no replica captured a snapshot to send: the move went by the log");
    let started = Instant::now();
    while heavy_pages_on(&cluster, target, id) < PAGES {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the target holds too few heavy pages\n{}",
            cluster.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    verify(&cluster, target, id, &log).unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    cluster.stop(target);
    let checked = fsck(&cluster, target);
    assert_eq!(checked["clean"].as_bool(), Some(true), "node {target} after the move: {checked:#}");
}
