//! The reference compute node (tundra-kv) on a real node: its RW node sends redo and its RO
//! nodes read at their own LSNs over the native protocol, while the node folds redo into
//! compressed pages in the background. Every RO read is checked against the workload's model
//! at the reader's LSN; a rebuild of the node on the same media keeps every commit.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tundra_client::Client;
use tundra_device::csd::CsdConfig;
use tundra_kv::{ClientStorage, PAGE_SIZE, RoConfig, RwConfig, WorkloadConfig, run_workload};
use tundra_node::{Environment, Node};
use tundra_store::volume::VolumeMode;

mod memory_node;
use memory_node::{Media, config, layout};

const PAGES: u64 = 2048;

#[test]
fn the_kv_workload_on_a_node_finds_no_mismatch_while_redo_folds() {
    let seed = tundra_env::seed_from_env(0x6b76);
    let layout = layout();
    let media = Media::new(&layout);
    let dir = tempfile::tempdir().unwrap();
    let csd = CsdConfig { background: false, ..CsdConfig::default() };
    let node = Node::from_devices(
        &config(dir.path()),
        layout.clone(),
        media.format_with(&layout, csd),
        &Environment::simulated(seed),
        false,
        &mut |_| {},
    )
    .unwrap();
    let node = Arc::new(node);
    let volume = node.volume_create("kv", PAGES * PAGE_SIZE as u64, PAGE_SIZE as u32, VolumeMode::Normal).unwrap();
    let server = tundra_node::native::start("127.0.0.1:0", node.clone()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let folder = {
        let (node, stop) = (node.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut folded = 0;
            while !stop.load(Ordering::Relaxed) {
                folded += node.fold_redo(64).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            folded
        })
    };
    let storage = Arc::new(ClientStorage::new(Client::connect(server.local_addr()).unwrap()).unwrap());
    let workload = WorkloadConfig {
        seed,
        key_space: 2_000,
        initial_keys: 1_000,
        transactions: 150,
        reads_per_txn: 8,
        ro_nodes: 2,
        ro_lag_commits: 3,
        rw: RwConfig { pool_pages: 32 },
        ro: RoConfig { cache_pages: 16, window_batches: 8 },
        rw_restart_every: 50,
        ..WorkloadConfig::default()
    };
    let report = run_workload(storage, volume.volume.id, &workload).unwrap();
    stop.store(true, Ordering::Relaxed);
    let folded = folder.join().unwrap();
    println!("seed {seed}: {report:?}, {folded} pages folded");
    assert_eq!(report.mismatches, 0, "{:?}", report.first_mismatch);
    assert!(report.reads_checked > 1_000, "{report:?}");
    assert!(folded > 0, "the node folded redo into pages during the run");
    let status = node.redo_status(&volume).unwrap();
    server.shutdown();
    drop(volume);
    drop(node);
    // The node rebuilt on the same media keeps every commit: its durable end is where it was.
    let node = Node::from_devices(
        &config(dir.path()),
        layout,
        media.open(),
        &Environment::simulated(seed),
        false,
        &mut |_| {},
    )
    .unwrap();
    let volume = node.volume_by_name("kv").unwrap();
    assert_eq!(node.redo_status(&volume).unwrap().durable_lsn, status.durable_lsn);
    for (device, report) in node.check().unwrap() {
        assert!(report.damaged.is_empty(), "{device:?}: {:?}", report.damaged);
    }
}
