//! The node in the configurations seed 000 §5.3 (Figure 13) compares: software compression by
//! Algorithm 1 (§3.3.2), by one algorithm or off, on a drive that compresses or does not. Each
//! test writes the same table-like pages through every write path (page protocol, block-device
//! writes through the write-back cache, partial writes and the background pass) and checks the
//! space each layer reports.

use tundra_env::Rng;
use tundra_node::{Config, DriveCompression, Node, NodeStats, SoftwareCompression, WriteMode};
use tundra_store::volume::VolumeMode;

const PAGE: usize = 8192;

fn config(dir: &std::path::Path, software: &str, drive: &str) -> Config {
    let mut config = Config::parse(&format!(
        r#"
        [drive]
        physical = "64MiB"
        logical = "128MiB"
        compression = "{drive}"
        [fast]
        volumes = "32MiB"
        [compression]
        software = "{software}"
        "#
    ))
    .unwrap();
    config.data_dir = dir.join("data");
    config
}

/// A heap page of rows as a database stores them: a header and free space, then rows of
/// text and numbers that differ from row to row (compresses about 3-5x, not trivially).
fn table_page(seed: u64) -> Vec<u8> {
    let carriers = ["UA", "AA", "DL", "B6", "EV", "WN", "MQ", "US"];
    let airports = ["EWR", "JFK", "LGA", "IAH", "ORD", "ATL", "LAX", "SFO", "MIA", "BOS"];
    let mut page = vec![0u8; PAGE];
    page[..8].copy_from_slice(&seed.to_le_bytes());
    let mut at = PAGE / 6;
    let mut rng = Rng::new(seed);
    let mut row = seed * 100;
    while at + 96 < PAGE {
        let x = rng.next_u64();
        let line = format!(
            "{row:08}|2013-{:02}-{:02}|{}|N{:05}|{}|{}|{:4}|{:+4}|",
            1 + x % 12,
            1 + (x >> 8) % 28,
            carriers[((x >> 16) % 8) as usize],
            (x >> 20) % 99_991,
            airports[((x >> 40) % 10) as usize],
            airports[((x >> 44) % 10) as usize],
            (x >> 48) % 1440,
            ((x >> 52) % 120) as i64 - 30,
        );
        page[at..at + line.len()].copy_from_slice(line.as_bytes());
        at += line.len() + 6;
        row += 1;
    }
    page
}

/// Writes 96 table pages of one mode normal volume through every path, runs the background
/// pass, reads every page back and returns the stats.
fn workload(dir: &std::path::Path, software: &str, drive: &str) -> NodeStats {
    let node = Node::open(&config(dir, software, drive), &mut |_| {}).unwrap();
    let db = node.volume_create("db", 4 << 20, PAGE as u32, VolumeMode::Normal).unwrap();
    // The page protocol: Algorithm 1, and pages whose writer named an algorithm or raw.
    for i in 0..32u64 {
        node.write_page(&db, i, WriteMode::Auto { update_fraction: None }, &table_page(i)).unwrap();
    }
    for (i, mode) in (32..44u64).zip([WriteMode::Lz4, WriteMode::Zstd, WriteMode::None].into_iter().cycle()) {
        node.write_page(&db, i, mode, &table_page(i)).unwrap();
    }
    // Block-device writes of whole pages, through the write-back cache and its flush.
    let run: Vec<u8> = (44..92u64).flat_map(table_page).collect();
    node.write_bytes(&db, 44 * PAGE as u64, &run).unwrap();
    node.flush(Some(&db)).unwrap();
    node.close().unwrap();
    // The volume holds the devices open as the node does.
    drop((db, node));
    // Pages written in pieces with the write-back cache off: each piece is merged into its
    // page and stored raw at once, then the background pass compresses the page again.
    let mut direct = config(dir, software, drive);
    direct.cache.write_back = "0".into();
    let node = Node::open(&direct, &mut |_| {}).unwrap();
    let db = node.volume_by_name("db").unwrap();
    for i in 92..96u64 {
        let content = table_page(i);
        for (half, bytes) in content.chunks(PAGE / 2).enumerate() {
            node.write_bytes(&db, i * PAGE as u64 + (half * PAGE / 2) as u64, bytes).unwrap();
        }
    }
    assert_eq!(node.stats().compressed.raw_pages - before_raw(&node, software), 4, "partial writes store raw");
    node.background().unwrap();
    let mut out = vec![0u8; PAGE];
    for i in 0..96u64 {
        node.read_page(&db, i, &mut out).unwrap();
        assert!(out == table_page(i), "page {i} reads back");
    }
    // The check also trims the blocks that rewrites freed (the store releases them in batches),
    // so that the drive maps exactly the blocks the pages use.
    for (device, report) in node.check().unwrap() {
        assert!(report.damaged.is_empty(), "{device:?}: {report:?}");
    }
    let stats = settled(&node);
    assert_eq!(stats.compressed.pages, 96, "{stats:?}");
    assert_eq!(stats.compressed.logical_bytes, 96 * PAGE as u64);
    node.close().unwrap();
    stats
}

/// The stats once the drive's thread has compressed every block it stored raw (the default
/// deferred mode), so that physical space is what the drive keeps.
fn settled(node: &Node) -> NodeStats {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let stats = node.stats();
        if stats.drive.deferred_pending_blocks == 0 {
            return stats;
        }
        assert!(std::time::Instant::now() < deadline, "the drive's thread never caught up: {:?}", stats.drive);
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Pages stored raw before the partial writes: those the page protocol asked raw (auto), or
/// all of them (off).
fn before_raw(node: &Node, software: &str) -> u64 {
    let whole = node.stats().compressed.pages - 4;
    match software {
        "auto" => 4,
        "off" => whole,
        _ => 0,
    }
}

/// Runs the workload on a fresh node in one configuration.
fn run(software: &str, drive: &str) -> NodeStats {
    let dir = tempfile::tempdir().unwrap();
    let stats = workload(dir.path(), software, drive);
    assert_eq!(stats.configuration.software_compression, software);
    assert_eq!(stats.configuration.drive_compression, drive);
    stats
}

/// Drive only: nothing is compressed in software, and the drive still compresses.
#[test]
fn software_off_leaves_compression_to_the_drive() {
    let stats = run("off", "on");
    let c = &stats.compressed;
    assert_eq!(c.raw_pages, 96, "{c:?}");
    assert_eq!((c.lz4_pages, c.zstd_pages, c.heavy_pages), (0, 0, 0), "{c:?}");
    assert_eq!(c.software_bytes, c.logical_bytes, "after software = logical: {c:?}");
    assert_eq!(stats.software_ratio, 1.0);
    let physical = stats.drive.physical_used_bytes;
    assert!(physical * 2 < c.software_bytes, "the drive compresses table pages: {physical} of {}", c.software_bytes);
}

/// Software only: the drive stores every block as written.
#[test]
fn drive_off_stores_what_the_software_wrote() {
    let stats = run("auto", "off");
    let c = &stats.compressed;
    assert_eq!(c.software_bytes % 4096, 0);
    // An 8 KiB page takes at least one 4 KiB block: software alone saves at most half.
    assert!(c.software_bytes * 4 < c.logical_bytes * 3, "software compression still runs: {c:?}");
    assert_eq!(stats.drive.physical_used_bytes, c.software_bytes, "{stats:?}");
    assert_eq!(stats.drive.mapped_bytes, c.software_bytes, "{stats:?}");
    assert_eq!(stats.drive_ratio, 1.0);
}

/// Neither layer: physical = after software = logical.
#[test]
fn both_off_store_pages_as_they_are() {
    let stats = run("off", "off");
    let c = &stats.compressed;
    assert_eq!(c.software_bytes, c.logical_bytes, "{c:?}");
    assert_eq!(stats.drive.physical_used_bytes, c.logical_bytes, "{stats:?}");
    assert_eq!(stats.ratio, 1.0);
}

#[test]
fn zstd_forced_stores_every_page_with_zstd() {
    let stats = run("zstd", "on");
    let c = &stats.compressed;
    assert_eq!((c.zstd_pages, c.lz4_pages, c.raw_pages), (96, 0, 0), "{c:?}");
    assert!(stats.drive.physical_used_bytes < c.software_bytes, "{stats:?}");
}

#[test]
fn lz4_forced_stores_every_page_with_lz4() {
    let stats = run("lz4", "on");
    let c = &stats.compressed;
    assert_eq!((c.lz4_pages, c.zstd_pages, c.raw_pages), (96, 0, 0), "{c:?}");
    assert!(stats.drive.physical_used_bytes < c.software_bytes, "{stats:?}");
}

/// Algorithm 1 as before: every page compressed with lz4 or zstd as chosen, except where the
/// writer named an algorithm or raw, which it gets; both layers compress.
#[test]
fn auto_chooses_per_page_and_honours_named_algorithms() {
    let stats = run("auto", "on");
    let c = &stats.compressed;
    assert_eq!(c.raw_pages, 4, "the writer asked for raw 4 times: {c:?}");
    assert!(c.lz4_pages >= 4 && c.zstd_pages >= 4, "{c:?}");
    assert_eq!(c.lz4_pages + c.zstd_pages, 92, "{c:?}");
    assert!(c.software_bytes * 4 < c.logical_bytes * 3, "{c:?}");
    assert!(stats.drive.physical_used_bytes < c.software_bytes, "{stats:?}");
    // The default configuration is this one.
    let default = Config::default();
    assert_eq!(default.compression.software, SoftwareCompression::Auto);
    assert_eq!(default.drive.compression, DriveCompression::On);
}

/// The drive's setting is not part of its media: a node started with the other setting reads
/// what the first one wrote, and its own writes follow its setting.
#[test]
fn drive_compression_can_change_between_starts() {
    let dir = tempfile::tempdir().unwrap();
    let first = workload(dir.path(), "off", "off");
    assert_eq!(first.drive.physical_used_bytes, first.compressed.logical_bytes);
    let node = Node::open(&config(dir.path(), "off", "on"), &mut |_| {}).unwrap();
    let db = node.volume_by_name("db").unwrap();
    let mut out = vec![0u8; PAGE];
    for i in 0..96u64 {
        node.read_page(&db, i, &mut out).unwrap();
        assert!(out == table_page(i), "page {i} after the restart");
    }
    for i in 0..48u64 {
        node.write_page(&db, i, WriteMode::Auto { update_fraction: None }, &table_page(i + 1000)).unwrap();
    }
    // The drive compresses in the background (at a low priority): on a busy host the rewrites
    // may still be raw at close, and a drive opened with compression off leaves them raw.
    settled(&node);
    node.close().unwrap();
    drop((db, node));
    let node = Node::open(&config(dir.path(), "off", "off"), &mut |_| {}).unwrap();
    let stats = node.stats();
    assert!(
        stats.drive.physical_used_bytes < first.drive.physical_used_bytes,
        "rewritten pages are compressed by the drive: {} then {}",
        first.drive.physical_used_bytes,
        stats.drive.physical_used_bytes
    );
    let db = node.volume_by_name("db").unwrap();
    for i in 0..96u64 {
        node.read_page(&db, i, &mut out).unwrap();
        let want = if i < 48 { table_page(i + 1000) } else { table_page(i) };
        assert!(out == want, "page {i} after the second restart");
    }
    for (device, report) in node.check().unwrap() {
        assert!(report.damaged.is_empty(), "{device:?}: {report:?}");
    }
}

#[test]
fn stats_json_reports_the_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::open(&config(dir.path(), "lz4", "off"), &mut |_| {}).unwrap();
    let json = serde_json::to_value(node.stats()).unwrap();
    assert_eq!(json["configuration"]["software_compression"], "lz4", "{json}");
    assert_eq!(json["configuration"]["drive_compression"], "off", "{json}");
}

#[test]
fn unknown_values_are_refused_with_the_key_and_the_choices() {
    for (text, key, value) in [
        ("[compression]\nsoftware = \"gzip\"", "software", "gzip"),
        ("[compression]\nsoftware = \"LZ4\"", "software", "LZ4"),
        ("[drive]\ncompression = \"yes\"", "compression", "yes"),
        ("[drive]\ncompression = true", "compression", "true"),
    ] {
        let error = Config::parse(text).unwrap_err().to_string();
        assert!(error.contains(key) && error.contains(value), "{text}: {error}");
    }
    let error = Config::parse("[compression]\nsoftware = \"gzip\"").unwrap_err().to_string();
    assert!(["auto", "lz4", "zstd", "off"].iter().all(|v| error.contains(v)), "{error}");
    let error = Config::parse("[drive]\ncompression = \"yes\"").unwrap_err().to_string();
    assert!(error.contains("on") && error.contains("off"), "{error}");
    for software in ["auto", "lz4", "zstd", "off"] {
        for drive in ["on", "off"] {
            let config =
                Config::parse(&format!("[compression]\nsoftware = \"{software}\"\n[drive]\ncompression = \"{drive}\""))
                    .unwrap();
            assert_eq!((config.compression.software.name(), config.drive.compression.name()), (software, drive));
        }
    }
}

/// The default drive compresses off the writer's path: a flush returns with blocks stored raw
/// and queued, its background thread compresses them, and the physical space then matches what
/// inline compression stores. The CPU it spent is reported apart from the host software's.
/// With `deferred = false` the same writes are compressed before they return.
#[test]
fn the_drive_compresses_on_its_own_thread_and_reports_its_cpu() {
    let mut physical = Vec::new();
    for deferred in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config(dir.path(), "off", "on");
        config.drive.deferred = deferred;
        let node = Node::open(&config, &mut |_| {}).unwrap();
        assert_eq!(node.configuration().drive_deferred, deferred);
        let db = node.volume_create("db", 4 << 20, PAGE as u32, VolumeMode::Normal).unwrap();
        let run: Vec<u8> = (0..256u64).flat_map(table_page).collect();
        node.write_bytes(&db, 0, &run).unwrap();
        node.flush(Some(&db)).unwrap();
        let stats = settled(&node);
        if deferred {
            assert!(stats.drive.deferred_compressed_blocks >= 256, "{:?}", stats.drive);
            assert!(stats.cpu.drive_background_seconds > 0.0, "{:?}", stats.cpu);
        } else {
            assert_eq!(stats.drive.deferred_compressed_blocks, 0, "{:?}", stats.drive);
            assert!(stats.cpu.drive_deflate_seconds > 0.0, "inline deflate runs in the writer: {:?}", stats.cpu);
        }
        assert!(stats.cpu.drive_seconds <= stats.cpu.process_seconds + 0.01, "{:?}", stats.cpu);
        assert!(stats.cpu.host_seconds > 0.0);
        let mut out = vec![0u8; PAGE];
        for i in 0..256u64 {
            node.read_page(&db, i, &mut out).unwrap();
            assert!(out == table_page(i), "page {i} reads back");
        }
        assert!(node.stats().cpu.drive_inflated_blocks > 0);
        physical.push(stats.drive.physical_used_bytes);
        node.close().unwrap();
    }
    assert_eq!(physical[0], physical[1], "deferred compression stores what inline compression stores");
    assert!(physical[0] * 2 < 256 * PAGE as u64, "the drive compressed the pages: {physical:?}");
}
