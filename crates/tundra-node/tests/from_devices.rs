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
