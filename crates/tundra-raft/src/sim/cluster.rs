//! A simulated cluster: nodes with memory devices behind the fault-injecting wrapper (a crash
//! keeps flushed blocks and a random choice of unflushed ones), an in-memory shared Raft log
//! with the same crash behaviour, and the simulated network, all on one current-thread tokio
//! runtime with a paused clock.
//!
//! Every node runs a replica of every chunk ([`Cluster::build`]), or, with a catalog
//! ([`Cluster::build_placed`]), only the chunks the catalog places on it, as a real node's
//! catalog decides which groups it starts; a node's start then also forgets what is left of a
//! chunk it no longer holds (moves.rs).

use std::collections::{BTreeMap, BTreeSet};
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
    /// Where each chunk's replicas are, when the cluster places them ([`Cluster::build_placed`]);
    /// `None`: every node holds every chunk.
    pub catalog: Option<BTreeMap<ChunkId, Placement>>,
    /// The injected bug of a move twin every host started carries, if any.
    pub host_bug: HostBug,
    /// Replicas a node's start forgot (it no longer held them).
    pub forgotten_at_start: u64,
    /// The most bytes of entries a node's appends carry, if the run cuts them short
    /// ([`Cluster::set_append_bytes`]).
    append_bytes: Option<usize>,
    /// Appends cut short by hosts that have since crashed.
    pub appends_cut_before: u64,
}

/// A bug injected into every host of a run with moves (a twin's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HostBug {
    #[default]
    None,
    /// Replicas forgotten keep their logs (`Host::set_forget_keeps_log`).
    ForgetKeepsLog,
    /// Replicas forgotten vote from an empty log (`Host::set_votes_unguarded`), on hosts that
    /// campaign on openraft's timer alone, as before pre-votes: the setting its seeds were
    /// found in.
    VotesUnguarded,
    /// Replicas forgotten campaign and vote short of what they held (`Host::set_held_unguarded`),
    /// on hosts that campaign on openraft's timer alone, as for `VotesUnguarded`.
    HeldUnguarded,
    /// Replicas campaign whenever openraft's timer fires (`Host::set_campaigns_unguarded`).
    CampaignsUnguarded,
}

/// A chunk's place in the simulation's catalog: its replicas (the group's voters, as far as
/// anything committed says), and the move under way, if any. The real system's catalog plays
/// this part (tundra-member's `VolumeDef`).
#[derive(Clone, Debug)]
pub struct Placement {
    pub replicas: BTreeSet<NodeId>,
    pub moving: Option<Moving>,
}

/// A move of one replica of a chunk from node `from` to node `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moving {
    pub chunk: ChunkId,
    pub from: NodeId,
    pub to: NodeId,
}

impl Placement {
    /// Whether `node` runs a replica: one of the replicas, or the target of the move under way
    /// (tundra-member's `VolumeDef::runs`). A committed voter is always one of them: the
    /// catalog drops a node only once the group's committed membership no longer names it.
    pub fn runs(&self, node: NodeId) -> bool {
        self.replicas.contains(&node) || self.moving.is_some_and(|m| m.to == node)
    }
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
        let mut cluster = Cluster::format(rng, net, nodes, chunks, fault, applied, repair_off);
        let voters: BTreeSet<NodeId> = (1..=nodes).collect();
        cluster.start_and_initialize(&vec![voters; chunks as usize]).await;
        cluster
    }

    /// Formats `nodes` nodes as [`Cluster::build`] does, with chunk `i` placed on the nodes of
    /// `placements[i]` only: the catalog starts each node's groups, and each group is
    /// initialized on its lowest replica.
    pub async fn build_placed(
        rng: &mut Rng,
        net: SimNet,
        nodes: u64,
        placements: &[BTreeSet<NodeId>],
        applied: Arc<Mutex<Applied>>,
        host_bug: HostBug,
    ) -> Cluster {
        let chunks = placements.len() as u32;
        let mut cluster = Cluster::format(rng, net, nodes, chunks, LogFault::None, applied, false);
        let catalog = cluster
            .chunks
            .iter()
            .zip(placements)
            .map(|(&chunk, replicas)| (chunk, Placement { replicas: replicas.clone(), moving: None }))
            .collect();
        cluster.catalog = Some(catalog);
        cluster.host_bug = host_bug;
        cluster.start_and_initialize(placements).await;
        cluster
    }

    /// Starts every node, then makes each chunk's `placements` its group's first membership,
    /// on the lowest of them.
    async fn start_and_initialize(&mut self, placements: &[BTreeSet<NodeId>]) {
        for i in 0..self.nodes.len() {
            self.start(i).await.expect("start a new node");
        }
        for (&chunk, replicas) in self.chunks.iter().zip(placements) {
            let first = *replicas.first().expect("a chunk has replicas");
            let host = self.nodes[(first - 1) as usize].host.clone().expect("every node is up");
            host.initialize(chunk, replicas.clone()).await.expect("initialize a group");
        }
    }

    /// The nodes' devices formatted, the volume created on each and their logs made; no node
    /// started. The random draws are those `build` always made, in the same order.
    fn format(
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
        Cluster {
            net,
            nodes: sim_nodes,
            chunks,
            applied,
            repair_off,
            repair_before: Vec::new(),
            catalog: None,
            host_bug: HostBug::None,
            forgotten_at_start: 0,
            append_bytes: None,
            appends_cut_before: 0,
        }
    }

    /// Cuts every node's appends to `bytes` of entries (at least one entry each), the nodes up
    /// now and those started later.
    pub fn set_append_bytes(&mut self, bytes: usize) {
        self.append_bytes = Some(bytes);
        for host in self.nodes.iter().filter_map(|node| node.host.as_ref()) {
            host.set_append_bytes(bytes);
        }
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
            LogFault::AppendClaimsAll => host.set_append_claims_all(true),
            LogFault::AnswerAtAppend => host.set_answer_at_append(true),
            _ => {}
        }
        if let Some(bytes) = self.append_bytes {
            host.set_append_bytes(bytes);
        }
        match self.host_bug {
            HostBug::None => {}
            HostBug::ForgetKeepsLog => host.set_forget_keeps_log(true),
            HostBug::VotesUnguarded => {
                host.set_votes_unguarded(true);
                host.set_campaigns_unguarded(true);
            }
            HostBug::HeldUnguarded => {
                host.set_held_unguarded(true);
                host.set_campaigns_unguarded(true);
            }
            HostBug::CampaignsUnguarded => host.set_campaigns_unguarded(true),
        }
        match &self.catalog {
            None => {
                for &chunk in &self.chunks {
                    host.add_group(chunk).await?;
                }
            }
            // As a real node starts: the groups its catalog says it runs, and what is left of
            // the others forgotten (tundra-member's catalog catch-up drops a replica the group
            // no longer lists). The catalog never drops a committed voter, so nothing a quorum
            // decided depends on what is forgotten here (seed 000 §3.2.1: the log is the
            // write-ahead log of the store's applies, so the two go together).
            Some(catalog) => {
                for &chunk in &self.chunks {
                    let placement = catalog.get(&chunk).expect("every chunk is in the catalog");
                    if placement.runs(node.id) {
                        host.add_group(chunk).await?;
                    } else if leftover(&host, chunk) {
                        forget_replica(&host, chunk, false).await?;
                        self.forgotten_at_start += 1;
                    }
                }
            }
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
        self.appends_cut_before += host.appends_cut();
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

/// Whether `host` holds anything of `chunk` beyond a vote: log entries, a purge point or a
/// committed position, pages, or an apply mark that says something was applied. A replica
/// forgotten whole holds none of these; a crash between the log's reset and the store's step
/// of a forget leaves the store's part.
pub fn leftover(host: &Host, chunk: ChunkId) -> bool {
    let log =
        host.log().with_group(chunk, |log| !log.entries.is_empty() || log.purged.is_some() || log.committed.is_some());
    let empty_mark = crate::mark::ApplyMark::default().encode();
    let store = host.store();
    log || !store.chunk_entries(chunk).is_empty() || store.chunk_mark(chunk).is_some_and(|mark| mark != empty_mark)
}

/// Forgets `host`'s replica of `chunk` through the host's own calls: `Host::drop_group` when
/// `stop` (the replica may run), `Host::forget_group_on` otherwise (it does not).
pub async fn forget_replica(host: &Arc<Host>, chunk: ChunkId, stop: bool) -> Result<(), String> {
    if stop { host.drop_group(chunk).await } else { host.forget_group_on(chunk, host.pages_of(chunk)).await }
}

std::thread_local! {
    /// Panics on this thread since [`take_panics`] last took them. A task that panics on the simulation's runtime (an
    /// assertion in openraft's core, say) stops with its group, and tokio only tells its
    /// handle: noted here, each is a violation of a run with moves.
    static PANICS: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Installs the panic hook that notes every panic on its thread (printed as before).
pub fn watch_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let text = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied())
                .unwrap_or_default();
            let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
            let line = format!("{}{at}", text.lines().next().unwrap_or_default());
            PANICS.with(|panics| panics.borrow_mut().push(line));
            previous(info);
        }));
    });
}

/// The panics noted on this thread since the last call.
pub fn take_panics() -> Vec<String> {
    PANICS.with(|panics| std::mem::take(&mut *panics.borrow_mut()))
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
