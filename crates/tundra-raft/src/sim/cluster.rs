//! A simulated cluster: nodes with memory devices behind the fault-injecting wrapper (a crash
//! keeps flushed blocks and a random choice of unflushed ones), an in-memory shared Raft log
//! with the same crash behaviour, and the simulated network, all on one current-thread tokio
//! runtime with a paused clock.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tundra_codec::{DecompressCost, PageCodec, PageSize, Selector, SelectorConfig};
use tundra_device::fault::FaultyDevice;
use tundra_device::mem::MemDevice;
use tundra_device::{BLOCK_SIZE, BlockDevice};
use tundra_env::Rng;
use tundra_store::ids::{ChunkId, PageNo, VolumeId};
use tundra_store::index::{Encoding, PageEntry};
use tundra_store::journal::{Journal, JournalGeometry};
use tundra_store::pages::{CpuLoad, Pages};
use tundra_store::store::{HEAVY_HEADER_BYTES, Store};
use tundra_store::volume::{Volume, VolumeMode};

use super::check::{Applied, chunk_digest};
use super::net::SimNet;
use crate::host::{Host, heartbeat_config};
use crate::log::{LogFault, MemLog};
use crate::repair::RepairStats;
use crate::state_machine::ApplyHook;
use crate::types::NodeId;
use parking_lot::Mutex;

pub const PAGE_BYTES: u32 = 8192;
const JOURNAL: JournalGeometry = JournalGeometry { checkpoint_blocks: 64, log_blocks: 512 };
const DATA_BLOCKS: u64 = 4096;
/// A flush of the shared log takes this long (an NVMe fsync).
const LOG_FLUSH: Duration = Duration::from_millis(1);

/// The one volume every node holds, created on every store when the cluster is built (the
/// cluster layer's job, outside any chunk group).
pub fn volume() -> Volume {
    Volume {
        id: VolumeId(1),
        name: "sim".into(),
        size_bytes: 8 * 1024 * 1024,
        page_size: PAGE_BYTES,
        chunk_bytes: 1024 * 1024,
        mode: VolumeMode::Normal,
    }
}

pub struct SimNode {
    pub id: NodeId,
    data: Arc<FaultyDevice<MemDevice>>,
    fast: Arc<FaultyDevice<MemDevice>>,
    pub log: Arc<MemLog>,
    pub host: Option<Arc<Host>>,
    nonce_seed: u64,
}

pub struct Cluster {
    pub net: SimNet,
    pub nodes: Vec<SimNode>,
    pub chunks: Vec<ChunkId>,
    applied: Arc<Mutex<Applied>>,
    /// Repair turned off on every node (the injected bug of the twin test).
    pub repair_off: bool,
    /// What repair did on hosts that have since crashed.
    pub repair_before: Vec<RepairStats>,
}

/// Pages a node's background scrub verifies per simulated second.
const SCRUB_PAGES_PER_SECOND: u64 = 20;

impl Cluster {
    /// Formats `nodes` nodes' devices, creates the volume on each, starts every host with a
    /// replica of every chunk, and initializes each group on node 1.
    pub async fn build(
        rng: &mut Rng,
        net: SimNet,
        nodes: u64,
        chunks: u32,
        fault: LogFault,
        applied: Arc<Mutex<Applied>>,
        repair_off: bool,
    ) -> Cluster {
        let mut sim_nodes = Vec::new();
        for id in 1..=nodes {
            let data = Arc::new(FaultyDevice::new(MemDevice::new(DATA_BLOCKS), rng.next_u64()));
            let fast = Arc::new(FaultyDevice::new(MemDevice::new(JOURNAL.total_blocks()), rng.next_u64()));
            Journal::format(fast.as_ref(), JOURNAL).expect("format a memory journal");
            let store = Store::open(data.clone(), fast.clone()).expect("open a new store");
            store.create_volume(volume()).expect("create the volume");
            drop(store);
            let log = Arc::new(MemLog::new(fault));
            sim_nodes.push(SimNode { id, data, fast, log, host: None, nonce_seed: rng.next_u64() });
        }
        let chunks = (0..chunks).map(|i| ChunkId::new(VolumeId(1), i)).collect();
        let mut cluster = Cluster { net, nodes: sim_nodes, chunks, applied, repair_off, repair_before: Vec::new() };
        for i in 0..cluster.nodes.len() {
            cluster.start(i).await.expect("start a new node");
        }
        let voters: BTreeSet<NodeId> = (1..=nodes).collect();
        let first = cluster.nodes[0].host.clone().expect("node 1 is up");
        for &chunk in &cluster.chunks {
            first.initialize(chunk, voters.clone()).await.expect("initialize a group");
        }
        cluster
    }

    /// Starts node `i` from what its devices and log hold (recovering them after a crash).
    pub async fn start(&mut self, i: usize) -> Result<(), String> {
        let node = &mut self.nodes[i];
        assert!(node.host.is_none());
        if node.data.is_crashed() {
            node.data.recover().map_err(|e| e.to_string())?;
            node.fast.recover().map_err(|e| e.to_string())?;
        }
        let store = Arc::new(Store::open(node.data.clone(), node.fast.clone()).map_err(|e| e.to_string())?);
        let codec = PageCodec::new(PageCodec::DEFAULT_ZSTD_LEVEL).map_err(|e| e.to_string())?;
        let selector = Selector::new(SelectorConfig::default(), codec, DecompressCost::nominal(PageSize::Kib8))
            .map_err(|e| e.to_string())?;
        let pages = Pages::new(store, PageSize::Kib8, selector, codec, CpuLoad::Fixed(0.0))
            .map_err(|e| e.to_string())?
            .with_nonce_seed(node.nonce_seed);
        let transport = Arc::new(self.net.incarnate(node.id));
        // Snapshots often, so that a replica that was down or cut off is often brought back
        // with the chunk sent whole rather than the entries it missed.
        let config = openraft::Config {
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(8),
            max_in_snapshot_log_to_keep: 2,
            purge_batch_size: 1,
            ..heartbeat_config(1)
        };
        let (applied, id) = (self.applied.clone(), node.id);
        let hook: ApplyHook = Arc::new(move |store: &Store, chunk: ChunkId, index: u64| {
            applied.lock().record(id, chunk, index, chunk_digest(store, chunk));
        });
        let hook = Some(hook);
        let host =
            Arc::new(Host::open(node.id, Arc::new(pages), node.log.clone(), LOG_FLUSH, transport, config, hook)?);
        match node.log.fault() {
            LogFault::ApplyUnflushed => host.log().set_ahead_bug(crate::log::AheadBug::ApplyUnflushed),
            LogFault::CommitUnflushed => host.log().set_ahead_bug(crate::log::AheadBug::CommitUnflushed),
            LogFault::ResumeTerm => host.log().set_ahead_bug(crate::log::AheadBug::ResumeTerm),
            _ => {}
        }
        for &chunk in &self.chunks {
            host.add_group(chunk).await?;
        }
        if self.repair_off {
            host.disable_repair();
        }
        if node.log.fault() == LogFault::PurgeUnsynced {
            host.purge_unsynced();
        }

        host.start_scrub(SCRUB_PAGES_PER_SECOND);
        self.net.up(node.id, host.clone());
        node.host = Some(host);
        Ok(())
    }

    /// Power loss on node `i`: its log writer stops, unflushed log records and device blocks
    /// are lost or kept at random (a torn tail), and its groups stop. Returns the log records
    /// lost.
    pub async fn crash(&mut self, i: usize, rng: &mut Rng) -> usize {
        let node = &mut self.nodes[i];
        let host = node.host.take().expect("a running node crashes");
        self.net.down(node.id);
        host.log().stop();
        node.data.crash();
        node.fast.crash();
        let lost = node.log.crash(rng);
        host.shutdown().await;
        self.repair_before.push(host.repair_stats());
        lost
    }

    /// Flips bits in the stored image of `page` of `chunk` on node `i`, in the device block
    /// that holds it, behind the store's back (the media went bad). Returns the page's entry
    /// when the image now fails its checksum; a flip that leaves the image verifying (a bit
    /// the decoder ignores) is undone, and a page that does not exist is left alone.
    pub fn corrupt(&self, i: usize, chunk: ChunkId, page: PageNo, rng: &mut Rng) -> Option<PageEntry> {
        let node = &self.nodes[i];
        let host = node.host.as_ref()?;
        let entry = host.store().entry(chunk, page)?;
        let device = node.data.inner();
        let mut blocks = vec![0u8; usize::from(entry.run.count) * BLOCK_SIZE];
        device.read(entry.run.first_lba(), &mut blocks).ok()?;
        // A page's image, or a heavy segment's frame (after its header; a heavy entry's stored
        // length is its place in the segment).
        let (from, len) = match entry.encoding {
            Encoding::Heavy => {
                let frame = u32::from_le_bytes(blocks[..4].try_into().expect("4 bytes")) as usize;
                (HEAVY_HEADER_BYTES, frame.min(blocks.len() - HEAVY_HEADER_BYTES))
            }
            _ => (0, usize::from(entry.stored_len)),
        };
        if len == 0 {
            return None;
        }
        let mut bad = blocks.clone();
        for _ in 0..rng.range(1..4) {
            let at = from + rng.below(len as u64) as usize;
            bad[at] ^= 1 << rng.below(8);
        }
        device.write(entry.run.first_lba(), &bad).ok()?;
        let path = host.pages_of(chunk);
        path.forget_all();
        if sound(host, chunk, page) {
            device.write(entry.run.first_lba(), &blocks).ok()?;
            return None;
        }
        Some(entry)
    }

    pub fn is_up(&self, i: usize) -> bool {
        self.nodes[i].host.is_some()
    }

    /// The host that leads `chunk` in the highest term any running node knows, if any.
    pub fn leader(&self, chunk: ChunkId) -> Option<Arc<Host>> {
        let mut best: Option<(u64, Arc<Host>)> = None;
        for host in self.nodes.iter().filter_map(|n| n.host.clone()) {
            let Ok(raft) = host.raft(chunk) else { continue };
            let metrics = raft.metrics().borrow().clone();
            if metrics.current_leader == Some(host.id()) && best.as_ref().is_none_or(|(t, _)| metrics.current_term > *t)
            {
                best = Some((metrics.current_term, host));
            }
        }
        best.map(|(_, host)| host)
    }

    pub async fn shutdown(&mut self) {
        for node in &mut self.nodes {
            if let Some(host) = node.host.take() {
                host.shutdown().await;
            }
        }
    }
}

/// Whether `page` of `chunk` reads back verified from `host`'s device: its image, or every
/// page of its heavy segment (past every cache).
pub fn sound(host: &Host, chunk: ChunkId, page: PageNo) -> bool {
    let path = host.pages_of(chunk);
    match host.store().entry(chunk, page) {
        Some(entry) if entry.encoding == Encoding::Heavy => {
            path.verify_segment(chunk, &path.segment_pages(chunk, &entry)).is_ok()
        }
        _ => path.verify_stored(chunk, page).is_ok(),
    }
}
