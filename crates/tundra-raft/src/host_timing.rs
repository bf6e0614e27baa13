//! The Raft timing a host gives the groups it starts ([`Host::add_groups_on`]): the timing of
//! the groups it runs once they are added, never faster than its own config. A host that chose
//! its timing once, when it ran no group, ran a volume of 1,000 chunks at 50 ms heartbeats, and
//! creating that volume timed out electing its groups.

use std::sync::Arc;
use std::time::Duration;

use tundra_codec::{DecompressCost, PageCodec, PageSize, Selector, SelectorConfig};
use tundra_device::mem::MemDevice;
use tundra_store::ids::{ChunkId, VolumeId};
use tundra_store::journal::{Journal, JournalGeometry};
use tundra_store::pages::{CpuLoad, Pages};
use tundra_store::store::Store;

use crate::host::{Host, heartbeat_config};
use crate::log::{LogFault, MemLog};
use crate::network::{Call, Envelope, Transport};

/// A node with no peers: every message is lost.
struct NoPeers;

impl Transport for NoPeers {
    fn call(&self, _envelope: Envelope) -> Call {
        Box::pin(async { Err("no peers".to_string()) })
    }
}

fn host(config: openraft::Config) -> (Host, Arc<Pages>) {
    let journal = JournalGeometry { checkpoint_blocks: 64, log_blocks: 512 };
    let data = Arc::new(MemDevice::new(4096));
    let fast = Arc::new(MemDevice::new(journal.total_blocks()));
    Journal::format(fast.as_ref(), journal).expect("format a memory journal");
    let store = Arc::new(Store::open(data, fast).expect("open a store"));
    let codec = PageCodec::new(PageCodec::DEFAULT_ZSTD_LEVEL).expect("codec");
    let selector =
        Selector::new(SelectorConfig::default(), codec, DecompressCost::nominal(PageSize::Kib8)).expect("selector");
    let pages = Arc::new(Pages::new(store, PageSize::Kib8, selector, codec, CpuLoad::Fixed(0.0)).expect("pages"));
    let log = Arc::new(MemLog::new(LogFault::None));
    let host = Host::open(1, pages.clone(), log, Duration::ZERO, Arc::new(NoPeers), config, None).expect("open a host");
    (host, pages)
}

fn heartbeat_ms(host: &Host, chunk: ChunkId) -> u64 {
    host.raft(chunk).expect("a group").config().heartbeat_interval
}

#[test]
fn groups_take_the_timing_of_the_groups_the_host_runs_once_they_are_added() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let (host, path) = host(heartbeat_config(0));
        let chunk = |i: u32| ChunkId::new(VolumeId(1), i);
        let pages = || path.clone();
        // Ten groups: the floor of 50 ms.
        let first: Vec<ChunkId> = (0..10).map(chunk).collect();
        host.add_groups_on(&first, pages()).await.expect("add");
        assert!(first.iter().all(|&c| heartbeat_ms(&host, c) == 50));
        // 290 more at once: the timing of 300 groups, for each of them; the first keep theirs.
        let more: Vec<ChunkId> = (10..300).map(chunk).collect();
        host.add_groups_on(&more, pages()).await.expect("add");
        assert!(more.iter().all(|&c| heartbeat_ms(&host, c) == 300), "{}", heartbeat_ms(&host, more[0]));
        let config = host.raft(more[0]).expect("a group").config().clone();
        assert_eq!((config.election_timeout_min, config.election_timeout_max), (900, 1800));
        assert!(first.iter().all(|&c| heartbeat_ms(&host, c) == 50));
        // Groups added again change nothing and count once.
        host.add_groups_on(&more, pages()).await.expect("add");
        host.add_group(chunk(300)).await.expect("add");
        assert_eq!(heartbeat_ms(&host, chunk(300)), 301);
        host.shutdown().await;
    });
    // A host whose own config is slower keeps it.
    runtime.block_on(async {
        let (host, _) = host(heartbeat_config(1000));
        host.add_group(ChunkId::new(VolumeId(1), 0)).await.expect("add");
        assert_eq!(heartbeat_ms(&host, ChunkId::new(VolumeId(1), 0)), 1000);
        host.shutdown().await;
    });
}
