//! The node end to end in one process: volumes, page and byte I/O, restart, fsck.

use tundra_env::{Rng, seed_from_env};
use tundra_node::{Config, Device, Error, Node, WriteMode};
use tundra_store::volume::VolumeMode;

fn config(dir: &std::path::Path) -> Config {
    let mut config = Config::parse(
        r#"
        [drive]
        physical = "64MiB"
        logical = "128MiB"
        [fast]
        volumes = "32MiB"
        "#,
    )
    .unwrap();
    config.data_dir = dir.join("data");
    config
}

fn page(seed: u64, len: usize) -> Vec<u8> {
    // Text-like content that compresses about threefold.
    let words = ["tundra ", "page ", "store ", "volume ", "drive ", "12345 ", "flights ", "\0\0\0\0"];
    let mut out = Vec::with_capacity(len);
    let mut rng = Rng::new(seed);
    while out.len() < len {
        out.extend_from_slice(rng.pick(&words).as_bytes());
    }
    out.truncate(len);
    out
}

#[test]
fn volumes_pages_bytes_restart_and_fsck() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let mut said = Vec::new();
    {
        let node = Node::open(&config, &mut |line| said.push(line.to_string())).unwrap();
        assert!(said.iter().any(|l| l.contains("setting up")), "{said:?}");
        let db = node.volume_create("pg", 16 << 20, 8192, VolumeMode::Normal).unwrap();
        let wal = node.volume_create("wal", 4 << 20, 8192, VolumeMode::None).unwrap();
        assert_eq!((db.device, wal.device), (Device::Drive, Device::Fast));
        assert!(matches!(node.volume_create("pg", 1 << 20, 8192, VolumeMode::Normal), Err(Error::Exists(_))));
        assert!(matches!(node.volume_create("big", 1 << 40, 8192, VolumeMode::Normal), Err(Error::NoSpace(_))));
        assert!(matches!(node.volume_create("odd", 12345, 8192, VolumeMode::Normal), Err(Error::Invalid(_))));

        for i in 0..200u64 {
            node.write_page(&db, i, WriteMode::Auto { update_fraction: None }, &page(i, 8192)).unwrap();
        }
        // Bytes: an unaligned write spanning pages, a whole-page write, zeroes.
        let blob = page(999, 20_000);
        node.write_bytes(&db, 300 * 8192 + 100, &blob).unwrap();
        let mut back = vec![0u8; blob.len()];
        node.read_bytes(&db, 300 * 8192 + 100, &mut back).unwrap();
        assert_eq!(back, blob);
        node.write_bytes(&wal, 4096, &blob).unwrap();
        node.zero_bytes(&db, 8192, 3 * 8192 + 10).unwrap();
        let mut zeros = vec![1u8; 3 * 8192 + 10];
        node.read_bytes(&db, 8192, &mut zeros).unwrap();
        assert!(zeros.iter().all(|&b| b == 0));
        let mut out = vec![0u8; 8192];
        node.read_page(&db, 4, &mut out).unwrap();
        assert_eq!(&out[10..], &page(4, 8192)[10..]);
        // Out of range and wrong sizes change nothing.
        assert!(matches!(node.read_bytes(&db, (16 << 20) - 10, &mut [0u8; 20]), Err(Error::Invalid(_))));
        assert!(matches!(node.write_page(&db, 1 << 30, WriteMode::Lz4, &page(1, 8192)), Err(Error::Invalid(_))));
        assert!(matches!(node.write_page(&db, 0, WriteMode::Lz4, &page(1, 4096)), Err(Error::Invalid(_))));

        // Byte writes wait in the write-back cache until a flush.
        assert!(node.stats().write_back_dirty_bytes > 0);
        node.flush(None).unwrap();
        // The drive compresses on its own thread (deferred): its ratio is read once it caught up.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while node.stats().drive.deferred_pending_blocks > 0 {
            assert!(std::time::Instant::now() < deadline, "the drive's thread never caught up");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let stats = node.stats();
        assert_eq!(stats.write_back_dirty_bytes, 0);
        let v = stats.volumes.iter().find(|v| v.name == "pg").unwrap();
        assert!(v.software_ratio > 1.5, "{v:?}");
        assert!(stats.ratio > v.software_ratio, "both layers beat software alone: {stats:?}");
        assert_eq!(stats.volumes.iter().find(|v| v.name == "wal").unwrap().space.raw_pages, 3);
        let text = tundra_node::metrics::render(&node);
        assert!(text.contains("tundra_page_write_seconds_count{volume=\"pg\"}"), "{text}");
        node.background().unwrap();
        node.close().unwrap();
    }
    // Restart: everything is there, and fsck is clean.
    let node = Node::open(&config, &mut |_| {}).unwrap();
    let db = node.volume_by_name("pg").unwrap();
    let mut out = vec![0u8; 8192];
    for i in [0u64, 5, 100, 199] {
        node.read_page(&db, i, &mut out).unwrap();
        assert_eq!(out, page(i, 8192), "page {i}");
    }
    let mut back = vec![0u8; 20_000];
    node.read_bytes(&db, 300 * 8192 + 100, &mut back).unwrap();
    assert_eq!(back, page(999, 20_000));
    for (device, report) in node.check().unwrap() {
        assert!(report.damaged.is_empty(), "{device:?}: {report:?}");
        assert!(report.pages > 0, "{device:?}: {report:?}");
    }
    node.volume_resize("pg", 32 << 20).unwrap();
    assert!(matches!(node.volume_resize("pg", 8 << 20), Err(Error::Invalid(_))));
    node.volume_delete("wal").unwrap();
    assert!(matches!(node.volume_by_name("wal"), Err(Error::NotFound(_))));
    for (device, report) in node.check().unwrap() {
        assert!(report.damaged.is_empty(), "{device:?}: {report:?}");
    }
}

#[test]
fn a_second_node_on_the_same_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let _node = Node::open(&config, &mut |_| {}).unwrap();
    assert!(Node::open(&config, &mut |_| {}).is_err());
}

#[test]
fn bad_configs_are_refused_with_the_key() {
    let err = Config::parse("[drive]\nphysicl = \"1GiB\"").unwrap_err().to_string();
    assert!(err.contains("physicl"), "{err}");
    let err = Config::parse("[compression]\ncpu_busy_threshold = 3.0").unwrap_err().to_string();
    assert!(err.contains("compression"), "{err}");
}

/// A write-back cache that a model follows exactly: block-device writes (whole pages, pieces,
/// zeroes) from several threads, interleaved with page-protocol writes, trims, flushes and the
/// background pass; every read, then a restart, then fsck agree with the model.
#[test]
fn the_write_back_cache_agrees_with_a_model_under_concurrency() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.cache.write_back = "256KiB".into(); // small, so writers also pass the limit
    const PAGES: u64 = 64;
    const PAGE: usize = 8192;
    let seed = seed_from_env(1);
    let expected: Vec<Vec<u8>>;
    {
        let node = Node::open(&config, &mut |_| {}).unwrap();
        let db = node.volume_create("db", PAGES * PAGE as u64, 8192, VolumeMode::Normal).unwrap();
        // Each thread owns the pages p with p % 4 == t, so its own reads have one right answer;
        // flushes and the background pass come from every thread.
        let models: Vec<Vec<Vec<u8>>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4u64)
                .map(|t| {
                    let (node, db) = (&node, &db);
                    scope.spawn(move || {
                        let mut model = vec![vec![0u8; PAGE]; PAGES as usize];
                        let mut rng = Rng::new(seed.wrapping_add(t));
                        for step in 0..400u64 {
                            let p = rng.below(PAGES / 4) * 4 + t;
                            let base = p * PAGE as u64;
                            match rng.below(8) {
                                0 | 1 => {
                                    let content = page(step * 10 + t, PAGE);
                                    node.write_bytes(db, base, &content).unwrap();
                                    model[p as usize] = content;
                                }
                                2 | 3 => {
                                    let at = rng.below(PAGE as u64) as usize;
                                    let len = 1 + rng.below((PAGE - at) as u64) as usize;
                                    let piece = page(step * 10 + t + 5, len);
                                    node.write_bytes(db, base + at as u64, &piece).unwrap();
                                    model[p as usize][at..at + len].copy_from_slice(&piece);
                                }
                                4 => {
                                    let content = page(step * 10 + t + 3, PAGE);
                                    node.write_page(db, p, WriteMode::Zstd, &content).unwrap();
                                    model[p as usize] = content;
                                }
                                5 => {
                                    if rng.below(2) == 0 {
                                        node.zero_bytes(db, base, PAGE as u64).unwrap();
                                    } else {
                                        node.trim_pages(db, p, 1).unwrap();
                                    }
                                    model[p as usize] = vec![0u8; PAGE];
                                }
                                6 => {
                                    if rng.below(3) == 0 {
                                        node.background().unwrap();
                                    } else {
                                        node.flush(Some(db)).unwrap();
                                    }
                                }
                                _ => {
                                    let mut out = vec![0u8; PAGE];
                                    node.read_bytes(db, base, &mut out).unwrap();
                                    assert!(out == model[p as usize], "thread {t} step {step}: page {p} differs");
                                }
                            }
                        }
                        model
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        expected = (0..PAGES).map(|p| models[(p % 4) as usize][p as usize].clone()).collect();
        for (p, want) in expected.iter().enumerate() {
            let mut out = vec![0u8; PAGE];
            node.read_page(&db, p as u64, &mut out).unwrap();
            assert!(&out == want, "page {p} before close");
        }
        node.close().unwrap();
    }
    let node = Node::open(&config, &mut |_| {}).unwrap();
    let db = node.volume_by_name("db").unwrap();
    for (p, want) in expected.iter().enumerate() {
        let mut out = vec![0u8; PAGE];
        node.read_page(&db, p as u64, &mut out).unwrap();
        assert!(&out == want, "page {p} after restart");
    }
    for (device, report) in node.check().unwrap() {
        assert!(report.damaged.is_empty(), "{device:?}: {report:?}");
    }
}

/// Unflushed block-device writes may be lost by a crash, flushed ones never: a node dropped
/// without close (as if killed) after a flush keeps what the flush covered.
#[test]
fn a_flush_makes_cached_writes_survive_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    {
        let node = Node::open(&config, &mut |_| {}).unwrap();
        let db = node.volume_create("db", 1 << 20, 8192, VolumeMode::Normal).unwrap();
        node.write_bytes(&db, 0, &page(1, 3 * 8192)).unwrap();
        node.write_bytes(&db, 4096, &page(2, 100)).unwrap();
        node.flush(Some(&db)).unwrap();
        assert_eq!(node.stats().write_back_dirty_bytes, 0);
        // Dropped without close (no Drop writes anything out): the cache is lost, as in a crash.
        node.write_bytes(&db, 8 * 8192, &page(3, 8192)).unwrap();
        drop(node);
    }
    let node = Node::open(&config, &mut |_| {}).unwrap();
    let db = node.volume_by_name("db").unwrap();
    let mut want = page(1, 3 * 8192);
    want[4096..4196].copy_from_slice(&page(2, 100));
    let mut out = vec![0u8; 3 * 8192];
    node.read_bytes(&db, 0, &mut out).unwrap();
    assert!(out == want);
}

/// A redo log's appends: pieces of one page, each followed by a flush. The first piece reads
/// the page from the store; once flushed, the page cache holds the page's new content, so the
/// next piece finds it there and reads nothing from the device. `tundra stats` counts the
/// pieces and the reads.
#[test]
fn pieces_of_a_page_flushed_one_by_one_read_it_from_the_device_once() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::open(&config(dir.path()), &mut |_| {}).unwrap();
    let wal = node.volume_create("wal", 1 << 20, 16384, VolumeMode::None).unwrap();
    node.write_bytes(&wal, 0, &page(1, 16384)).unwrap();
    node.flush(Some(&wal)).unwrap();
    let misses = node.stats().cache_misses;
    let mut want = page(1, 16384);
    for n in 0..8usize {
        let piece = page(100 + n as u64, 1024);
        node.write_bytes(&wal, (n * 1024) as u64, &piece).unwrap();
        want[n * 1024..(n + 1) * 1024].copy_from_slice(&piece);
        node.flush(Some(&wal)).unwrap();
    }
    let stats = node.stats();
    assert_eq!((stats.write_back_pieces, stats.write_back_piece_reads), (8, 8), "every piece found its page flushed");
    assert_eq!(stats.cache_misses, misses + 1, "pieces read their page from the device more than once");
    let mut out = vec![0u8; 16384];
    node.read_bytes(&wal, 0, &mut out).unwrap();
    assert!(out == want);
    node.close().unwrap();
    drop((wal, node));
    let node = Node::open(&config(dir.path()), &mut |_| {}).unwrap();
    let wal = node.volume_by_name("wal").unwrap();
    node.read_bytes(&wal, 0, &mut out).unwrap();
    assert!(out == want, "the pieces did not survive a restart");
}

#[test]
fn a_flush_covers_its_own_volume_and_leaves_the_others_cached() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    {
        let node = Node::open(&config, &mut |_| {}).unwrap();
        let data = node.volume_create("data", 1 << 20, 8192, VolumeMode::Normal).unwrap();
        let wal = node.volume_create("wal", 1 << 20, 8192, VolumeMode::None).unwrap();
        node.write_bytes(&data, 0, &page(10, 4 * 8192)).unwrap();
        node.write_bytes(&wal, 0, &page(11, 2 * 8192)).unwrap();
        // The redo volume's flush writes its own pages only: the data pages stay in the cache,
        // still readable from it, and are not compressed on the redo path.
        node.flush(Some(&wal)).unwrap();
        assert_eq!(node.stats().write_back_dirty_bytes, 4 * 8192);
        let mut out = vec![0u8; 4 * 8192];
        node.read_bytes(&data, 0, &mut out).unwrap();
        assert!(out == page(10, 4 * 8192));
        drop(node);
    }
    let node = Node::open(&config, &mut |_| {}).unwrap();
    let (data, wal) = (node.volume_by_name("data").unwrap(), node.volume_by_name("wal").unwrap());
    let mut out = vec![0u8; 2 * 8192];
    node.read_bytes(&wal, 0, &mut out).unwrap();
    assert!(out == page(11, 2 * 8192), "the flushed volume survives the crash");
    let mut out = vec![0u8; 8192];
    node.read_bytes(&data, 0, &mut out).unwrap();
    assert!(out == vec![0u8; 8192], "the other volume's unflushed pages were never written");
}

/// Uncompressed volumes live on the fast device, whose store reuses freed blocks without
/// trimming them: rewrites through the write-back cache keep every page readable, a check of
/// the running node (which trims the free blocks first) is clean, and deleting the volume
/// gives its blocks back to the filesystem holding fast.img.
#[test]
fn rewrites_on_the_fast_device_reuse_blocks_and_a_delete_gives_them_back() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let node = Node::open(&config, &mut |_| {}).unwrap();
    let wal = node.volume_create("wal", 1 << 20, 8192, VolumeMode::None).unwrap();
    for round in 0..6u64 {
        // Whole pages, and pieces that straddle two pages.
        for p in 0..64u64 {
            node.write_bytes(&wal, p * 8192, &page(round * 1000 + p, 8192)).unwrap();
        }
        node.write_bytes(&wal, 8192 - 100, &page(round, 200)).unwrap();
        node.flush(Some(&wal)).unwrap();
        node.background().unwrap();
    }
    let mut want: Vec<u8> = (0..64u64).flat_map(|p| page(5000 + p, 8192)).collect();
    want[8192 - 100..8192 + 100].copy_from_slice(&page(5, 200));
    let mut out = vec![0u8; 64 * 8192];
    node.read_bytes(&wal, 0, &mut out).unwrap();
    assert!(out == want);
    for (device, report) in node.check().unwrap() {
        assert!(report.damaged.is_empty(), "{device:?}: {report:?}");
    }
    let allocated = || std::fs::metadata(config.data_dir.join("fast.img")).unwrap().blocks() * 512;
    let before = allocated();
    node.volume_delete("wal").unwrap();
    assert!(allocated() + 64 * 8192 <= before, "{} then {}", before, allocated());
    node.close().unwrap();
}

/// A database's WAL write and its fsync (one 8 KiB page, then a flush of its volume) is one
/// group commit of the fast store's journal that carries the page's image and does not flush
/// the data device; a flush of many pages flushes the data device once. Both read back after a
/// restart.
#[test]
fn a_wal_write_and_its_flush_cost_one_log_flush() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    {
        let node = Node::open(&config, &mut |_| {}).unwrap();
        let wal = node.volume_create("wal", 4 << 20, 8192, VolumeMode::None).unwrap();
        let before = node.stats().journals.fast;
        node.write_bytes(&wal, 8192, &page(1, 8192)).unwrap();
        node.flush(Some(&wal)).unwrap();
        let after = node.stats().journals.fast;
        assert_eq!(after.group_commits, before.group_commits + 1, "{before:?} {after:?}");
        assert_eq!(after.data_flushes, before.data_flushes, "a WAL commit flushed the data device");
        assert_eq!(after.carried_images, before.carried_images + 1);
        // The fast store writes behind: the image waits for the background pass, and the page
        // reads back meanwhile.
        assert_eq!(after.waiting_images, 1, "{after:?}");
        let mut back = vec![0u8; 8192];
        node.read_bytes(&wal, 8192, &mut back).unwrap();
        assert!(back == page(1, 8192));
        node.checkpoint_if_wanted().unwrap();
        assert_eq!(node.stats().journals.fast.waiting_images, 0);
        node.write_bytes(&wal, 16 * 8192, &page(2, 64 * 8192)).unwrap();
        node.flush(Some(&wal)).unwrap();
        let batch = node.stats().journals.fast;
        assert_eq!(batch.carried_images, after.carried_images, "a batch of 64 pages carried images");
        assert!(batch.data_flushes > after.data_flushes, "a batch of pages did not flush the data device");
        node.close().unwrap();
    }
    let node = Node::open(&config, &mut |_| {}).unwrap();
    let wal = node.volume_by_name("wal").unwrap();
    let mut back = vec![0u8; 8192];
    node.read_bytes(&wal, 8192, &mut back).unwrap();
    assert_eq!(back, page(1, 8192));
    let mut back = vec![0u8; 64 * 8192];
    node.read_bytes(&wal, 16 * 8192, &mut back).unwrap();
    assert_eq!(back, page(2, 64 * 8192));
}

/// Byte reads of many pages at once against a model of the volume's bytes: pages stored, pages
/// still in the write-back cache, pages zeroed, pages never written, across the boundary of two
/// chunks, unaligned at both ends; before a flush, after it and after a restart.
#[test]
fn reads_of_many_pages_match_a_model_across_chunks_and_the_write_back_cache() {
    const PAGE: u64 = 8192;
    const CHUNK: u64 = 1 << 30;
    // A window of 48 pages around the first chunk boundary.
    const BASE: u64 = CHUNK - 24 * PAGE;
    const WINDOW: usize = 48 * PAGE as usize;
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    // A volume of two chunks (1 GiB and 4 MiB) needs a drive logically that big.
    config.drive.logical = Some("2GiB".into());
    let seed = seed_from_env(11);
    let mut rng = Rng::new(seed);
    let mut model = vec![0u8; WINDOW];
    let check = |node: &Node, db: &tundra_node::VolumeRef, model: &[u8], rng: &mut Rng| {
        for _ in 0..40 {
            let start = rng.below(WINDOW as u64 - 1) as usize;
            let len = 1 + rng.below((WINDOW - start) as u64) as usize;
            let mut out = vec![0xA5u8; len];
            node.read_bytes(db, BASE + start as u64, &mut out).unwrap();
            assert!(out == model[start..start + len], "seed {seed}: bytes {start}..{} of the window", start + len);
        }
        let mut all = vec![0u8; WINDOW];
        node.read_bytes(db, BASE, &mut all).unwrap();
        assert!(all == model, "seed {seed}: the whole window");
    };
    {
        let node = Node::open(&config, &mut |_| {}).unwrap();
        let db = node.volume_create("pg", CHUNK + (4 << 20), PAGE as u32, VolumeMode::Normal).unwrap();
        for round in 0..6u64 {
            for op in 0..24u64 {
                let tag = round * 100 + op;
                let index = rng.below(48);
                match rng.below(4) {
                    // A whole page stored at once (the page protocol).
                    0 => {
                        let content = page(tag, PAGE as usize);
                        node.write_page(&db, BASE / PAGE + index, WriteMode::Auto { update_fraction: None }, &content)
                            .unwrap();
                        model[(index * PAGE) as usize..][..PAGE as usize].copy_from_slice(&content);
                    }
                    // Bytes into the write-back cache, often over several pages.
                    1 | 2 => {
                        let at = rng.below(WINDOW as u64 - 1);
                        let len = 1 + rng.below((WINDOW as u64 - at).min(5 * PAGE));
                        let content = page(tag, len as usize);
                        node.write_bytes(&db, BASE + at, &content).unwrap();
                        model[at as usize..(at + len) as usize].copy_from_slice(&content);
                    }
                    // Zeros over whole pages and pieces.
                    _ => {
                        let at = rng.below(WINDOW as u64 - 1);
                        let len = 1 + rng.below((WINDOW as u64 - at).min(3 * PAGE));
                        node.zero_bytes(&db, BASE + at, len).unwrap();
                        model[at as usize..(at + len) as usize].fill(0);
                    }
                }
            }
            check(&node, &db, &model, &mut rng);
            if round % 2 == 1 {
                node.flush(None).unwrap();
                check(&node, &db, &model, &mut rng);
            }
        }
        node.flush(None).unwrap();
        node.close().unwrap();
    }
    let node = Node::open(&config, &mut |_| {}).unwrap();
    let db = node.volume_by_name("pg").unwrap();
    check(&node, &db, &model, &mut rng);
}
