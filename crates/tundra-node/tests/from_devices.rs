//! A node built from devices and inputs the test chooses, with no data directory: memory
//! devices, a layout written out by hand, fixed decompression costs and a fixed CPU load. It
//! serves I/O, survives a rebuild on the same devices, and touches no file.

use tundra_codec::{DecompressCost, LinearCost, PageSize};
use tundra_node::{Environment, Error, Node, WriteMode};
use tundra_store::volume::VolumeMode;

mod memory_node;
use memory_node::{MIB, Media, config, layout};

fn environment() -> Environment {
    let cost = |page_size| DecompressCost {
        page_size,
        lz4: LinearCost { fixed_us: 1.0, us_per_byte: 0.001 },
        zstd: LinearCost { fixed_us: 4.0, us_per_byte: 0.004 },
    };
    Environment { decompress_costs: vec![cost(PageSize::Kib8), cost(PageSize::Kib16)], ..Environment::simulated(7) }
}

#[test]
fn a_node_on_memory_devices_serves_io_and_survives_a_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let layout = layout();
    let media = Media::new(&layout);
    let env = environment();
    let page: Vec<u8> = b"tundra page ".iter().copied().cycle().take(8192).collect();
    let blob: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    {
        let mut said = Vec::new();
        let node = Node::from_devices(&config, layout.clone(), media.format(&layout), &env, false, &mut |l| {
            said.push(l.to_string())
        })
        .unwrap();
        assert!(said.iter().any(|l| l.contains("recovering")), "{said:?}");
        let db = node.volume_create("db", 4 * MIB, 8192, VolumeMode::Normal).unwrap();
        let wal = node.volume_create("wal", MIB, 16384, VolumeMode::None).unwrap();
        node.write_page(&db, 3, WriteMode::Auto { update_fraction: None }, &page).unwrap();
        node.write_bytes(&db, 5 * 8192 + 100, &blob).unwrap();
        node.write_bytes(&wal, 4096, &blob).unwrap();
        node.zero_bytes(&db, 5 * 8192 + 200, 10_000).unwrap();
        node.close().unwrap();
    }
    let node = Node::from_devices(&config, layout, media.open(), &env, false, &mut |_| {}).unwrap();
    let db = node.volume_by_name("db").unwrap();
    let wal = node.volume_by_name("wal").unwrap();
    let mut out = vec![0u8; 8192];
    node.read_page(&db, 3, &mut out).unwrap();
    assert_eq!(out, page);
    let mut expected = blob.clone();
    expected[100..10_100].fill(0);
    let mut back = vec![0u8; blob.len()];
    node.read_bytes(&db, 5 * 8192 + 100, &mut back).unwrap();
    assert_eq!(back, expected);
    node.read_bytes(&wal, 4096, &mut back).unwrap();
    assert_eq!(back, blob);
    for (device, report) in node.check().unwrap() {
        assert!(report.damaged.is_empty(), "{device:?}: {:?}", report.damaged);
    }
    // The data directory only names the node: nothing was made there.
    assert_eq!(node.data_dir(), config.data_dir);
    assert!(!config.data_dir.exists());
}

#[test]
fn an_environment_without_a_page_sizes_cost_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let layout = layout();
    let media = Media::new(&layout);
    let mut env = environment();
    env.decompress_costs.retain(|cost| cost.page_size == PageSize::Kib8);
    let built =
        Node::from_devices(&config(dir.path()), layout.clone(), media.format(&layout), &env, false, &mut |_| {});
    assert!(matches!(built, Err(Error::Invalid(ref m)) if m.contains("16384-byte pages")), "{:?}", built.err());
}

/// A CPU gauge the test turns from busy to idle.
struct Switch(std::sync::atomic::AtomicBool);

impl tundra_env::CpuGauge for Switch {
    fn busy_fraction(&self) -> Result<f64, String> {
        Ok(if self.0.load(std::sync::atomic::Ordering::Relaxed) { 0.9 } else { 0.0 })
    }
}

/// The node's background work chooses again, once the host is idle and at the configured rate,
/// the pages a busy host stored with lz4 without comparing, and `stats` reports what it won.
#[test]
fn the_background_pass_chooses_again_pages_written_on_a_busy_host() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.compression.rechoose_pages_per_second = 16;
    let layout = layout();
    let media = Media::new(&layout);
    let busy = std::sync::Arc::new(Switch(std::sync::atomic::AtomicBool::new(true)));
    let mut env = environment();
    env.env = tundra_env::Env::new(env.env.clock.clone(), env.env.fork_rng(), busy.clone());
    let devices = media.format(&layout);
    let node = Node::from_devices(&config, layout, devices, &env, false, &mut |_| {}).unwrap();
    let db = node.volume_create("db", 4 * MIB, 8192, VolumeMode::Normal).unwrap();
    // Rows of text: both algorithms compress them, so the comparison may pick either, but the
    // busy host never compared.
    let page = |i: u64| -> Vec<u8> {
        (0..8192u64).map(|j| b"2013-01-01|UA|N12345|EWR|IAH|"[(j % 29) as usize] ^ ((i + j / 512) % 7) as u8).collect()
    };
    let run: Vec<u8> = (0..40u64).flat_map(page).collect();
    node.write_bytes(&db, 0, &run).unwrap();
    node.flush(Some(&db)).unwrap();
    assert_eq!(node.stats().rechoose.pending_pages, 40);
    node.background().unwrap();
    let stats = node.stats().rechoose;
    assert_eq!((stats.pending_pages, stats.examined_pages), (40, 0), "{stats:?}");
    assert!(stats.busy_passes >= 1);
    busy.0.store(false, std::sync::atomic::Ordering::Relaxed);
    node.background().unwrap();
    assert_eq!(node.stats().rechoose.examined_pages, 16, "at most the configured rate per pass");
    for _ in 0..3 {
        node.background().unwrap();
    }
    let stats = node.stats().rechoose;
    assert_eq!((stats.pending_pages, stats.examined_pages), (0, 40), "{stats:?}");
    assert!(stats.bytes_after <= stats.bytes_before, "{stats:?}");
    let mut out = vec![0u8; 8192];
    for i in 0..40u64 {
        node.read_page(&db, i, &mut out).unwrap();
        assert!(out == page(i), "page {i}");
    }
}
