//! A node as a member of a cluster ([`ClusterNode`]): the node's stores, its Raft host with a
//! group per chunk of each replicated volume, the shared Raft log in `raft.log`, the
//! connections to its peers, and the catalog of replicated volumes. This module builds it,
//! answers peers' requests, and creates replicated volumes; io.rs serves page I/O through
//! the chunks' leaders and status.rs reports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tundra_node::{ClusterConfig, Node};
use tundra_raft::log::{FileLog, FileLogBug, OsLogFile};
use tundra_raft::{Host, heartbeat_config};
use tundra_store::ids::{ChunkId, VolumeId};
use tundra_store::volume::VolumeMode;

use crate::catalog::Catalog;
use crate::io::PageLocks;
use crate::messages::{Answer, ChunkSize, Forward, NodeUsage, PeerRequest, PeerResponse, Refusal, VolumeDef};
use crate::peers::Membership;
use crate::transport::{Handler, PeerTransport};

/// How long a volume's creation waits for the manager to hold a fresh report of every node
/// (a few report periods, manager.rs).
const REPORTS_WAIT: Duration = Duration::from_secs(10);

/// The file of the node's shared Raft log, in its data directory.
pub const RAFT_LOG_FILE: &str = "raft.log";
/// The directory in a node's data directory of its snapshot files (tundra-raft's snapshot.rs).
pub const SNAPSHOT_DIR: &str = "snapshots";
/// The log is compacted past this size (and twice its size after the last compaction).
const COMPACT_BYTES: u64 = 64 << 20;
/// How long a peer may take over a forwarded request before it counts as lost.
pub(crate) const FORWARD_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a volume's creation waits for a peer it cannot reach yet.
pub(crate) const CONNECT_WAIT: Duration = Duration::from_secs(5);
/// How long a node that restarted waits before it settles the moves its catalog lists.
const SETTLE_DELAY: Duration = Duration::from_secs(2);
/// How long a volume's creation waits for its groups' first leaders.
const FIRST_LEADER_WAIT: Duration = Duration::from_secs(20);

/// A node of a cluster.
pub struct ClusterNode {
    pub me: u64,
    pub node: Arc<Node>,
    pub(crate) host: Arc<Host>,
    pub(crate) transport: PeerTransport,
    pub(crate) membership: Membership,
    pub(crate) catalog: Mutex<Catalog>,
    pub(crate) locks: PageLocks,
    pub(crate) redo_turns: crate::redo::RedoTurns,
    /// The LSN given to the next page this node writes as a leader: above every LSN it gave
    /// before, since it starts from the clock in microseconds.
    pub(crate) lsn: AtomicU64,
    /// The id of this node's next client request: from a random start, so ids of different
    /// nodes and of one node's runs do not meet.
    pub(crate) next_request: AtomicU64,
    /// One manager call at a time on the manager's leader (manager.rs).
    pub(crate) manager_turn: tokio::sync::Mutex<()>,
    /// One volume delete's local steps at a time here (delete.rs).
    pub(crate) deletes: tokio::sync::Mutex<()>,
    /// `[cluster]`'s rebalancing keys (rebalance.rs).
    pub(crate) rebalance: crate::rebalance::RebalanceSettings,
    /// On the manager's leader, only under the test hook `TUNDRA_TEST_CLAIM_IN_MEMORY`: who
    /// may make moves, until when (manager.rs's `Claim`; otherwise in the replicated state).
    pub(crate) move_claim: Mutex<Option<(crate::manager::MoveOwner, std::time::Instant)>>,
    /// The background rebalancer's record (background.rs).
    pub(crate) background: Mutex<crate::background::BackgroundStatus>,
    /// Set at shutdown: background work stops at its next check.
    pub(crate) stopping: std::sync::atomic::AtomicBool,
    /// The background rebalancer's thread, joined at shutdown.
    pub(crate) rebalancer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// `[cluster] manager_replace_after`: how long a manager member may be silent before the
    /// manager's leader replaces it (manager_members.rs); None: never.
    pub(crate) manager_replace_after: Option<Duration>,
    /// The manager's members' bookkeeping on this node (manager_members.rs).
    pub(crate) member_work: crate::manager_members::MemberWork,
    /// `[cluster] repair_after`: how long a node may be silent before the manager's leader
    /// moves its replicas onto up nodes (dead_nodes.rs); None: never.
    pub(crate) repair_after: Option<Duration>,
    /// The repair's bookkeeping on this node (dead_nodes.rs).
    pub(crate) repair: crate::dead_nodes::RepairWork,
    /// The volumes this node refused to adopt from its peers' catalogs, by id, and why
    /// (adopt.rs).
    pub(crate) refused_volumes: Mutex<BTreeMap<u32, String>>,
    /// As the manager's leader: the placements it watches for use (abandoned.rs).
    pub(crate) placements: Mutex<crate::abandoned::Watch>,
    /// The background rounds' moves refused for good (background.rs), kept across rounds.
    pub(crate) lasting_skips: Mutex<Vec<crate::rebalance::SkippedMove>>,
    /// `[cluster] peers` as configured: the nodes added while running are the others (join.rs).
    pub(crate) configured_peers: Vec<String>,
    /// Peers' nodes this node refused to link (their id or address clashes with one it knows),
    /// said once each in its log (join.rs).
    pub(crate) refused_peers: Mutex<BTreeSet<(u64, String)>>,
    runtime: tokio::runtime::Runtime,
}

impl ClusterNode {
    /// Joins `node` to the cluster `config` describes: opens the Raft log in the node's data
    /// directory, listens for peers, starts a group for every chunk of every replicated volume
    /// the catalog names (creating a volume the store lacks, which a crash between the two
    /// writes leaves), and dials the peers.
    pub fn start(config: &ClusterConfig, node: Arc<Node>) -> Result<Arc<ClusterNode>, String> {
        let membership = Membership::load(config, node.data_dir())?;
        let rebalance = crate::rebalance::RebalanceSettings::from_config(config)?;
        let leader_balance = crate::leaders::LeaderBalanceSettings::from_config(config)?;
        let manager_replace_after = crate::manager_members::replace_after_from_config(config)?;
        let repair_after = crate::dead_nodes::repair_after_from_config(config)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("tundra-member")
            .enable_all()
            .build()
            .map_err(|e| format!("starting the cluster runtime: {e}"))?;
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(membership.my_addr()))
            .map_err(|e| format!("listening for peers on {}: {e}", membership.my_addr()))?;
        let catalog = Catalog::open(node.data_dir())?;
        let log_path = node.data_dir().join(RAFT_LOG_FILE);
        // A benchmark hook: `TUNDRA_TEST_RAFT_LOG_APPENDS=1` grows the log by its frames alone
        // (cluster_bench's baseline for the log grown ahead). Unset in production.
        let log_file = if std::env::var("TUNDRA_TEST_RAFT_LOG_APPENDS").is_ok_and(|v| v == "1") {
            OsLogFile::appending(&log_path)
        } else {
            OsLogFile::new(&log_path)
        };
        let media = FileLog::open(log_file, COMPACT_BYTES, FileLogBug::None)
            .map_err(|e| format!("{}: {e}", log_path.display()))?;
        let transport = PeerTransport::new(membership.me, &membership.others(), membership.key.clone());
        transport.pace().set_rate(rebalance.move_bytes_per_sec);
        let default_pages = node.drive_pages(8192).ok_or("the node has no page path for 8 KiB pages")?;
        // The timing of a node with no group: each volume's groups take the timing of the
        // groups the node runs once they are added (`Host::add_groups_on`). Volumes open in
        // the catalog's order, which is their creation order on every node, so a restarted
        // node gives each group the timing it had, and its peers give it, when it was created.
        let mut raft_config = heartbeat_config(0);
        // A snapshot is the whole chunk: taken rarely, and the log keeps enough entries for a
        // replica that was down for a short while to catch up from the log alone.
        raft_config.snapshot_policy = openraft::SnapshotPolicy::LogsSinceLast(1024);
        raft_config.max_in_snapshot_log_to_keep = 256;
        raft_config.purge_batch_size = 64;
        let mut host = runtime.block_on(async {
            Host::open(
                membership.me,
                default_pages,
                Arc::new(media),
                Duration::ZERO,
                Arc::new(transport.clone()),
                raft_config,
                None,
            )
        })?;
        // A benchmark hook: `TUNDRA_TEST_LEADER_SYNC_FIRST=1` makes a leader's appends wait for
        // its own log's sync before the followers see them (openraft 0.9 alone), the baseline
        // of reporting them flushed early (tundra-raft's log/mod.rs).
        if std::env::var("TUNDRA_TEST_LEADER_SYNC_FIRST").is_ok_and(|v| v == "1") {
            host.log().set_ahead(false);
        }
        // A twin's hook: `TUNDRA_TEST_FORGET_KEEPS_LOG=1` keeps a dropped replica's Raft log,
        // the bug the move-back test must catch (tundra-raft's `Host::forget_group_on`).
        if std::env::var("TUNDRA_TEST_FORGET_KEEPS_LOG").is_ok_and(|v| v == "1") {
            host.set_forget_keeps_log(true);
        }
        // A twin's hook: `TUNDRA_TEST_APPEND_BYTES=N` caps appends at N bytes of entries instead
        // of tundra-raft's `APPEND_BYTES` (a huge N: appends as large as openraft makes them, the
        // bug cluster_catch_up must catch).
        if let Some(bytes) = std::env::var("TUNDRA_TEST_APPEND_BYTES").ok().and_then(|v| v.parse().ok()) {
            host.set_append_bytes(bytes);
        }
        // Snapshots' extents, captured to send and staged as received, on the node's disk.
        host.set_snapshot_dir(node.data_dir().join(SNAPSHOT_DIR))?;
        let start_lsn = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_micros());
        let cluster = Arc::new(ClusterNode {
            me: membership.me,
            node,
            host: Arc::new(host),
            transport,
            membership,
            catalog: Mutex::new(catalog),
            locks: PageLocks::default(),
            redo_turns: Default::default(),
            lsn: AtomicU64::new(start_lsn as u64),
            next_request: AtomicU64::new(random_u64()? | 1),
            manager_turn: tokio::sync::Mutex::new(()),
            deletes: tokio::sync::Mutex::new(()),
            rebalance,
            move_claim: Mutex::new(None),
            background: Mutex::new(Default::default()),
            stopping: std::sync::atomic::AtomicBool::new(false),
            rebalancer: Mutex::new(None),
            manager_replace_after,
            member_work: Default::default(),
            repair_after,
            repair: Default::default(),
            refused_volumes: Mutex::new(BTreeMap::new()),
            placements: Mutex::new(Default::default()),
            lasting_skips: Mutex::new(Vec::new()),
            configured_peers: config.peers.clone(),
            refused_peers: Mutex::new(BTreeSet::new()),
            runtime,
        });
        let defs: Vec<VolumeDef> = cluster.catalog.lock().volumes().to_vec();
        // A volume marked deleting starts no group: the delete upkeep finishes it (delete.rs).
        for def in defs.iter().filter(|def| !def.deleting) {
            cluster.runtime.block_on(cluster.open_replica(def))?;
        }
        let weak = Arc::downgrade(&cluster);
        // A replicated volume is never mounted on the node's store directly (mount.rs).
        if !crate::mount::on_store_for_test() {
            let served = weak.clone();
            cluster
                .node
                .set_cluster_volumes(Box::new(move |id| served.upgrade().is_some_and(|c| c.is_replicated(id.0))));
        }
        cluster.runtime.block_on(async { cluster.transport.start(listener, handler(weak.clone())) });
        let scrub = config.scrub_pages_per_sec.unwrap_or(tundra_node::config::DEFAULT_SCRUB_PAGES_PER_SEC);
        cluster.runtime.block_on(async { cluster.host.start_scrub(scrub) });
        cluster.start_manager()?;
        cluster.start_redo_upkeep();
        cluster.start_leader_balance(leader_balance);
        cluster.start_election_log();
        cluster.start_delete_upkeep();
        cluster.start_dead_node_work();
        // Moves this node's catalog lists were under way when it stopped: settle them once the
        // peers are connected (crate::migrate).
        if cluster.catalog.lock().volumes().iter().any(|def| !def.moves.is_empty() || def.redo_move.is_some()) {
            cluster.runtime.spawn(async move {
                tokio::time::sleep(SETTLE_DELAY).await;
                if let Some(cluster) = weak.upgrade() {
                    cluster.settle_all().await;
                }
            });
        }
        Ok(cluster)
    }

    /// Runs `future` on the cluster's runtime in the background.
    pub(crate) fn spawn(&self, future: impl Future<Output = ()> + Send + 'static) {
        self.runtime.spawn(future);
    }

    /// Runs `future` on the cluster's runtime from a thread outside it (a protocol's
    /// connection thread).
    pub(crate) fn block_on<T>(&self, future: impl Future<Output = T>) -> T {
        self.runtime.handle().block_on(future)
    }

    /// Whether volume `id` is replicated (its I/O goes through the chunks' groups).
    pub fn is_replicated(&self, id: u32) -> bool {
        self.catalog.lock().get(id).is_some()
    }

    pub fn transport(&self) -> &PeerTransport {
        &self.transport
    }

    /// The node this node believes leads `chunk`.
    pub(crate) fn local_leader(&self, chunk: ChunkId) -> Option<u64> {
        self.host.raft(chunk).ok().and_then(|raft| raft.metrics().borrow().current_leader)
    }

    /// Stops the background rebalancer (after the move it is making, if any), then every group
    /// and the log writer (what they had not flushed stays unflushed).
    pub fn shutdown(&self) {
        crate::background::stop(self);
        self.block_on(self.host.shutdown());
    }

    /// A peer's request, answered.
    async fn handle(&self, request: PeerRequest) -> PeerResponse {
        match request {
            PeerRequest::Raft(envelope) => PeerResponse::Raft(self.host.handle(envelope).await),
            PeerRequest::Forward(forward) => PeerResponse::Forward(self.serve(forward).await),
        }
    }

    /// Does what a [`Forward`] asks, here.
    pub(crate) async fn serve(&self, forward: Forward) -> Result<Answer, Refusal> {
        match forward {
            Forward::Write { volume, chunk, pages, request, retry } => {
                let t0 = std::time::Instant::now();
                tundra_raft::lat::mark("lead_write");
                let r = self.lead_write(volume, ChunkId(chunk), pages, request, retry).await;
                tundra_raft::lat::mark("lead_write.done");
                tundra_raft::lat::note("member.lead_write", t0);
                r
            }
            Forward::Read { volume, chunk, pages } => self.lead_read(volume, ChunkId(chunk), pages).await,
            Forward::Trim { volume, chunk, pages } => self.lead_trim(volume, ChunkId(chunk), pages).await,
            Forward::Adopt(def) => self.adopt_for_move(def).await,
            Forward::AddPeer { id, addr } => self.link_peer(id, &addr).map(|_| Answer::Done).map_err(Refusal::Invalid),
            Forward::Peers => Ok(Answer::Peers(self.membership.nodes())),
            Forward::Heavy { volume, chunk, first, count } => {
                self.lead_heavy(volume, ChunkId(chunk), first, count).await
            }
            Forward::Prepare { name } => {
                if self.node.volume_by_name(&name).is_ok() {
                    return Err(Refusal::Invalid(format!("node {} has a volume named {name:?} already", self.me)));
                }
                Ok(Answer::VolumeId(self.node.next_volume_id().0))
            }
            Forward::CreateVolume(def) => {
                self.enter_volume(&def).await.map_err(Refusal::Invalid)?;
                Ok(Answer::Done)
            }
            Forward::Initialize { volume } => self.initialize_from(volume, 0).await.map(|()| Answer::Done),
            Forward::LocalStatus => Ok(Answer::Status(self.local_status())),
            Forward::Redo { volume, call } => {
                let t0 = std::time::Instant::now();
                let r = self.lead_redo(volume, call).await;
                tundra_raft::lat::note("member.lead_redo", t0);
                r
            }
            Forward::Usage => Ok(Answer::Usage(self.usage())),
            Forward::SetChunk { volume, chunk, replicas, moving } => tokio::task::block_in_place(|| {
                self.catalog.lock().set_chunk(volume, chunk, replicas, moving).map(|()| Answer::Done)
            })
            .map_err(Refusal::Invalid),
            Forward::StartReplica { volume, chunk } => self.start_replica(volume, chunk).await,
            Forward::DropReplica { volume, chunk } => self.drop_replica(volume, chunk).await,
            Forward::Membership { volume, chunk, change } => self.change_membership(volume, chunk, change).await,
            // Boxed: the manager's leader asks nodes (itself among them) in turn.
            Forward::Manager(call) => Box::pin(self.lead_manager(call)).await,
            Forward::ChunkSizes => Ok(Answer::ChunkSizes(self.chunk_sizes())),
            Forward::SetRedo { volume, replicas, moving } => tokio::task::block_in_place(|| {
                self.catalog.lock().set_redo(volume, replicas, moving).map(|()| Answer::Done)
            })
            .map_err(Refusal::Invalid),
            Forward::StartRedo { volume } => self.start_redo(volume).await,
            Forward::DropRedo { volume } => self.drop_redo(volume).await,
            Forward::RedoMembership { volume, change } => self.change_redo_membership(volume, change).await,
            Forward::ManagerJoin => self.join_manager().await,
            Forward::ManagerLeave => self.leave_manager().await,
            Forward::Delete { volume, step } => self.delete_step(volume, step).await,
            Forward::Resize { volume, step } => self.resize_step(volume, step).await,
            Forward::Catalog => Ok(Answer::Catalog(self.catalog.lock().volumes().to_vec())),
            Forward::DeletedVolumes => Ok(Answer::DeletedVolumes(self.catalog.lock().deleted().to_vec())),
        }
    }

    /// The space of every chunk replica this node runs (not the volumes' redo groups nor the
    /// manager's).
    pub(crate) fn chunk_sizes(&self) -> Vec<ChunkSize> {
        let groups = self.host.groups();
        tokio::task::block_in_place(|| {
            groups
                .into_iter()
                .filter(|&group| tundra_raft::manager_machine::is_chunk_group(group))
                .map(|chunk| self.chunk_size(chunk))
                .collect()
        })
    }

    /// The space of one chunk replica this node runs (it reads the chunk's index entries).
    pub(crate) fn chunk_size(&self, chunk: ChunkId) -> ChunkSize {
        let space = self.node.chunk_space(chunk);
        ChunkSize {
            volume: chunk.volume().0,
            chunk: chunk.index(),
            pages: space.pages,
            logical_bytes: space.logical_bytes,
            physical_bytes: space.physical_bytes,
        }
    }

    /// This node's drive space: the drive's logical and physical capacity, the logical bytes
    /// of the pages it holds and the media bytes they take.
    pub(crate) fn usage(&self) -> NodeUsage {
        let stats = tokio::task::block_in_place(|| self.node.stats());
        NodeUsage {
            logical_capacity_bytes: stats.drive.logical_capacity_bytes,
            physical_capacity_bytes: stats.drive.physical_capacity_bytes,
            logical_used_bytes: stats.compressed.logical_bytes,
            physical_used_bytes: stats.drive.physical_used_bytes,
            overcommit: self.node.drive_overcommit(),
        }
    }

    /// Enters a replicated volume here: its definition in the catalog, durably, then the volume
    /// in the store with the same id and its groups started ([`ClusterNode::open_replica`]). A
    /// crash in between leaves the catalog naming a volume the store lacks, which the node's
    /// start creates. A creation's every answering node does this, and a node that was away
    /// when adopting (adopt.rs).
    pub(crate) async fn enter_volume(&self, def: &VolumeDef) -> Result<(), String> {
        tokio::task::block_in_place(|| self.catalog.lock().add(def.clone()))?;
        self.open_replica(def).await
    }

    /// Creates the volume in the store if it is not there yet (every node has it, so that any
    /// node can serve its I/O) and starts the groups of the chunks this node holds a replica of.
    async fn open_replica(&self, def: &VolumeDef) -> Result<(), String> {
        let volume = match self.node.volume(VolumeId(def.id)) {
            Ok(volume) => volume,
            Err(_) => tokio::task::block_in_place(|| {
                self.node.volume_create_as(
                    Some(VolumeId(def.id)),
                    &def.name,
                    def.size_bytes,
                    def.page_size,
                    VolumeMode::Normal,
                )
            })
            .map_err(|e| format!("creating replicated volume {:?} here: {e}", def.name))?,
        };
        if volume.volume.name != def.name {
            return Err(format!("volume id {} is {:?} here, not {:?}", def.id, volume.volume.name, def.name));
        }
        // Only the chunks whose replica (or a move's target) this node is; the store grown
        // first if a resize entered the catalog and the node stopped before its store grew.
        self.grow_replica(def).await?;
        self.open_redo_group(def).await
    }

    /// Makes each chunk's replicas the first membership of its group, for the chunks from
    /// index `from` on (0 at a creation, the first new one at a resize) whose first leader is
    /// this node.
    pub(crate) async fn initialize_from(&self, volume: u32, from: u32) -> Result<(), Refusal> {
        let def = self.catalog.lock().get(volume).cloned();
        let def = def.ok_or_else(|| Refusal::Invalid(format!("volume id {volume} is not replicated here")))?;
        let volume = self.node.volume(VolumeId(volume)).map_err(|e| Refusal::Invalid(e.to_string()))?;
        // The catalog's chunks: a store grown past its catalog (resize.rs) has no more.
        let count = chunk_spans(def.size_bytes).len() as u32;
        let all: Vec<ChunkId> = chunks(&volume.volume).filter(|chunk| chunk.index() < count).collect();
        let firsts =
            first_leaders(&all.iter().map(|chunk| def.replicas_of(chunk.index()).to_vec()).collect::<Vec<_>>());
        for (chunk, first) in all.into_iter().zip(firsts) {
            let replicas = def.replicas_of(chunk.index());
            if first != Some(self.me) || chunk.index() < from {
                continue;
            }
            let voters: BTreeSet<u64> = replicas.iter().copied().collect();
            if let Err(why) = self.host.initialize(chunk, voters.clone()).await {
                // A group initialized before (a retried creation) keeps its membership.
                if !why.contains("NotAllowed") && !why.contains("not allowed") {
                    return Err(Refusal::Unavailable(why));
                }
            }
        }
        Ok(())
    }

    /// The manager's state once it holds a fresh report of each of `nodes` (all of which just
    /// answered), waiting at most [`REPORTS_WAIT`]: in a cluster just started the first reports
    /// may not have reached the manager yet, and placing before them would count those nodes
    /// as unknown and call the cluster full. After the wait the state is taken as it is, and
    /// placement names the nodes still unknown.
    pub(crate) async fn manager_state_reported_by(
        &self,
        nodes: &[u64],
    ) -> Result<(tundra_cluster::ClusterState, u64), Refusal> {
        let deadline = std::time::Instant::now() + REPORTS_WAIT;
        loop {
            let (state, now_unix_ms) = self.manager_state_now().await?;
            let unreported = nodes.iter().any(|&node| {
                state.node(tundra_cluster::NodeId(node)).is_none_or(|n| {
                    n.reported_used.is_none() || tundra_cluster::mover::report_stale(n.reported_unix_ms, now_unix_ms)
                })
            });
            if !unreported || std::time::Instant::now() >= deadline {
                return Ok((state, now_unix_ms));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Creates a volume with `replicas` replicas of each chunk, while some nodes may be down
    /// (issue 15). Which nodes must answer: this node (the coordinator), a majority of the
    /// cluster's nodes, and every node placed a replica (placement picks only nodes whose
    /// reports are fresh, and a node that did not answer but still counts as up refuses the
    /// creation before anything is placed). The id is the largest next id any answering node
    /// would give: two majorities share a node, and every answering node enters the volume in
    /// its store, so a later creation's answering nodes always include one that has used the
    /// id. A creation refused before any node entered it gives its placements back
    /// (abandoned.rs), so that a retry, which takes the same id, places afresh; one whose
    /// coordinator died there left them, and a retry finds them (the manager answers a placed
    /// chunk's replicas) until the manager's leader forgets them. A creation half done when its
    /// coordinator died may leave an id on a node outside the next majority, which that node
    /// then refuses to adopt for another volume (adopt.rs). Each chunk's replicas are placed by
    /// tundra-cluster, the definition entered in every answering node's
    /// catalog (every node serves the volume's I/O; the others learn it from their peers'
    /// catalogs when they return, dead_nodes.rs), each group's first membership set on its
    /// first replica, and the creation answered once every chunk has a leader. Refused before
    /// anything is created when too few nodes answer.
    pub fn create_replicated(&self, name: &str, size_bytes: u64, page_size: u32, replicas: u8) -> Result<u32, Refusal> {
        let nodes = self.membership.ids();
        if usize::from(replicas) > nodes.len() {
            return Err(Refusal::Invalid(format!(
                "--replicas {replicas} needs as many nodes, and this cluster has {}",
                nodes.len()
            )));
        }
        self.block_on(async {
            let next_ids = self.prepare_all(name, &nodes).await?;
            let answering: Vec<u64> = next_ids.keys().copied().collect();
            let silent: Vec<u64> = nodes.iter().copied().filter(|node| !answering.contains(node)).collect();
            let majority = nodes.len() / 2 + 1;
            if answering.len() < majority || !answering.contains(&self.me) {
                return Err(Refusal::Unavailable(format!(
                    "only nodes {answering:?} of {nodes:?} answer: creating a replicated volume needs a majority \
                     ({majority}) of the cluster's nodes up; nothing was created"
                )));
            }
            let spans = chunk_spans(size_bytes);
            // The cluster manager places the chunks (seed 000 §4.2.1): its committed state
            // chose the replicas, whichever node asked, among the nodes whose reports are
            // fresh; the thin-provisioning share is counted from the same state.
            let (state, now_unix_ms) = self.manager_state_reported_by(&answering).await?;
            if let Some(counted_up) = silent.iter().find(|&&node| {
                state.node(tundra_cluster::NodeId(node)).is_some_and(|n| {
                    n.status == tundra_cluster::NodeStatus::Active
                        && !tundra_cluster::mover::report_stale(n.reported_unix_ms, now_unix_ms)
                })
            }) {
                return Err(Refusal::Unavailable(format!(
                    "node {counted_up} does not answer, and the cluster manager still counts it up (its last report is \
                     fresh): retry once its report is stale ({} s); nothing was created",
                    tundra_cluster::mover::REPORT_STALE_AFTER_MS / 1000
                )));
            }
            let id = next_ids.values().copied().max().unwrap_or(0);
            let usage = crate::placement::reported_usage(&state, now_unix_ms);
            let share = crate::placement::overcommitted_share(&usage, &spans, usize::from(replicas));
            let expected: Vec<u64> = spans.iter().map(|&bytes| ((bytes as f64 * share) as u64).max(1)).collect();
            // Placement takes only nodes that report: name those that do not answer now.
            let down = match silent.as_slice() {
                [] => String::new(),
                ids => {
                    let ids: Vec<String> = ids.iter().map(u64::to_string).collect();
                    format!(" (node {} does not answer and gets no replica)", ids.join(", "))
                }
            };
            // No node's catalog names volume `id` yet: a refusal from here until the first
            // `CreateVolume` gives the placements back (abandoned.rs).
            let placed_at = std::time::Instant::now();
            let placed = spans.len() as u32;
            let sets = match self.manager_place(id, &expected, usize::from(replicas)).await {
                Ok(sets) => sets,
                Err(why) => {
                    self.forget_placed(id, 0..placed).await;
                    return Err(match why {
                        Refusal::Invalid(why) => {
                            Refusal::Invalid(format!("the cluster cannot hold volume {name:?}{down}: {why}"))
                        }
                        other => other,
                    });
                }
            };
            let mut all: Vec<u64> = sets.iter().flatten().copied().collect();
            all.sort_unstable();
            all.dedup();
            if let Some(absent) = all.iter().find(|node| !answering.contains(node)) {
                self.forget_placed(id, 0..placed).await;
                return Err(Refusal::Unavailable(format!(
                    "the cluster manager placed a replica of {name:?} on node {absent}, which did not answer; retry"
                )));
            }
            if crate::abandoned::stops_after_place_for_test(name) {
                return Err(Refusal::Unavailable(format!(
                    "volume {name:?} placed; the coordinator stops here (test hook)"
                )));
            }
            if let Some(refusal) = crate::abandoned::too_slow(placed_at.elapsed(), &format!("the creation of {name:?}"))
            {
                self.forget_placed(id, 0..placed).await;
                return Err(refusal);
            }
            let def = VolumeDef {
                id,
                name: name.to_string(),
                size_bytes,
                page_size,
                replicas: all.clone(),
                chunks: sets,
                moves: Vec::new(),
                redo: None,
                redo_move: None,
                deleting: false,
                served_bytes: None,
            };
            for &node in &answering {
                self.ask(node, Forward::CreateVolume(def.clone())).await?;
            }
            let firsts: BTreeSet<u64> = first_leaders(&def.chunks).into_iter().flatten().collect();
            for node in firsts {
                self.ask(node, Forward::Initialize { volume: id }).await?;
            }
            for index in 0..def.chunks.len() as u32 {
                let chunk = ChunkId::new(VolumeId(id), index);
                let confirm = Forward::Read { volume: id, chunk: chunk.0, pages: Vec::new() };
                tokio::time::timeout(FIRST_LEADER_WAIT, self.to_leader(chunk, confirm))
                    .await
                    .map_err(|_| Refusal::Unavailable(format!("chunk {index} of {name:?} elected no leader")))??;
            }
            Ok(id)
        })
    }

    /// Each answering node's next volume id, asked of every node in `nodes` and asked again
    /// of those unreachable for up to [`CONNECT_WAIT`] (a node that just started may not have
    /// connected to its peers yet; a node down stays unreachable). A node that has a volume
    /// named `name` refuses the creation.
    async fn prepare_all(&self, name: &str, nodes: &[u64]) -> Result<BTreeMap<u64, u32>, Refusal> {
        let deadline = tokio::time::Instant::now() + CONNECT_WAIT;
        let mut next_ids = BTreeMap::new();
        loop {
            let missing: Vec<u64> = nodes.iter().copied().filter(|node| !next_ids.contains_key(node)).collect();
            for node in missing {
                match self.ask(node, Forward::Prepare { name: name.to_string() }).await {
                    Ok(Answer::VolumeId(next)) => {
                        next_ids.insert(node, next);
                    }
                    Ok(other) => return Err(Refusal::Unavailable(format!("node {node} answered {other:?}"))),
                    Err(Refusal::Invalid(why)) => return Err(Refusal::Invalid(why)),
                    Err(_) => {}
                }
            }
            if next_ids.len() == nodes.len() || tokio::time::Instant::now() >= deadline {
                return Ok(next_ids);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// [`ClusterNode::ask`], asked again while the node is unreachable, for up to
    /// [`CONNECT_WAIT`] (a node that just started may not have connected to its peers yet).
    pub(crate) async fn ask_patiently(&self, node: u64, forward: Forward) -> Result<Answer, Refusal> {
        let deadline = tokio::time::Instant::now() + CONNECT_WAIT;
        loop {
            match self.ask(node, forward.clone()).await {
                Err(Refusal::Unavailable(_)) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => return other,
            }
        }
    }

    /// Sends `forward` to `node` (or does it here) and returns its answer.
    pub(crate) async fn ask(&self, node: u64, forward: Forward) -> Result<Answer, Refusal> {
        if node == self.me {
            return self.serve(forward).await;
        }
        match self.transport.call(node, &PeerRequest::Forward(forward), FORWARD_TIMEOUT).await {
            Ok(PeerResponse::Forward(answer)) => answer,
            Ok(PeerResponse::Raft(_)) => Err(Refusal::Unavailable(format!("node {node} answered another kind"))),
            Err(why) => Err(Refusal::Unavailable(why)),
        }
    }
}

fn random_u64() -> Result<u64, String> {
    use std::io::Read;
    let mut bytes = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut file| file.read_exact(&mut bytes))
        .map_err(|e| format!("reading /dev/urandom: {e}"))?;
    Ok(u64::from_le_bytes(bytes))
}

/// The chunks of a volume.
pub(crate) fn chunks(volume: &tundra_store::volume::Volume) -> impl Iterator<Item = ChunkId> + use<> {
    let count = volume.page_count().div_ceil(volume.pages_per_chunk()).max(1);
    let id = volume.id;
    (0..count as u32).map(move |index| ChunkId::new(id, index))
}

/// How many chunks a volume of `size_bytes` has (as many as [`chunk_spans`] gives), counted
/// without a list: the size may come from a peer.
pub(crate) fn chunk_count(size_bytes: u64) -> u64 {
    size_bytes.div_ceil(tundra_store::volume::DEFAULT_CHUNK_BYTES).max(1)
}

/// The logical bytes of each chunk of a volume of `size_bytes`: whole chunks, and the rest.
pub(crate) fn chunk_spans(size_bytes: u64) -> Vec<u64> {
    let chunk = tundra_store::volume::DEFAULT_CHUNK_BYTES;
    (0..chunk_count(size_bytes)).map(|index| (size_bytes - index * chunk).min(chunk)).collect()
}

fn handler(cluster: Weak<ClusterNode>) -> Handler {
    Arc::new(move |_from, request| {
        let cluster = cluster.clone();
        Box::pin(async move {
            match cluster.upgrade() {
                Some(cluster) => cluster.handle(request).await,
                None => PeerResponse::Raft(Err("the node is stopping".into())),
            }
        })
    })
}

/// The data directory holds a node that has been part of a cluster.
pub fn has_cluster_state(data_dir: &Path) -> bool {
    data_dir.join(RAFT_LOG_FILE).exists()
}

/// The replica of each chunk that initializes its group, and so leads it first (openraft's
/// `initialize` elects the node it runs on): chunk after chunk, the replica that leads the
/// fewest of the chunks before it, the lowest id on a tie. Every node computes the same from
/// the catalog, and a volume's leaders spread evenly over its replicas' nodes instead of all
/// falling to each chunk's first replica (node 1 led 999 of 1,000 groups that way).
pub(crate) fn first_leaders(replica_sets: &[Vec<u64>]) -> Vec<Option<u64>> {
    let mut led: BTreeMap<u64, usize> = BTreeMap::new();
    replica_sets
        .iter()
        .map(|replicas| {
            let first = replicas.iter().copied().min_by_key(|node| (led.get(node).copied().unwrap_or(0), *node));
            if let Some(node) = first {
                *led.entry(node).or_default() += 1;
            }
            first
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::first_leaders;

    #[test]
    fn first_leaders_spread_evenly_over_the_replicas() {
        let sets: Vec<Vec<u64>> = (0..30).map(|_| vec![1, 2, 3]).collect();
        let leaders = first_leaders(&sets);
        for node in 1..=3 {
            assert_eq!(leaders.iter().filter(|l| **l == Some(node)).count(), 10);
        }
        // Chunks on subsets of five nodes: every node leads within one of the others.
        let sets: Vec<Vec<u64>> = (0..50u64).map(|i| vec![1 + i % 5, 1 + (i + 1) % 5, 1 + (i + 3) % 5]).collect();
        let leaders = first_leaders(&sets);
        let counts: Vec<usize> = (1..=5).map(|n| leaders.iter().filter(|l| **l == Some(n)).count()).collect();
        assert!(counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1, "{counts:?}");
        assert!(leaders.iter().zip(&sets).all(|(l, set)| set.contains(&l.unwrap())));
    }
}
