//! The cluster manager (seed 000 §4.2) as a Raft group of its own (tundra-raft's
//! `manager_machine`): its members are `[cluster] managers` (by default the three lowest node
//! ids), each applying the committed `tundra_cluster::Command`s to its copy of the
//! `ClusterState`, with its snapshot in `manager.snapshot` in the data directory. Any node
//! asks the group's leader ([`ClusterNode::to_manager`], asked again through failovers), which
//! alone proposes:
//!
//! - every node's drive usage, reported every second (`ManagerCall::Report`): the leader adds a
//!   node it does not know (`AddNode`) and proposes a timed `Report` when a figure the state
//!   keeps moved, or when the node's last one is older than `REPORT_REFRESH_MS` (2 s), so that
//!   a live node's report stays fresh and a silent node's goes stale (older than
//!   `REPORT_STALE_AFTER_MS`, 5 s: unknown to placement and plans);
//! - on a leader whose state is empty (a cluster's first leader, or one started before the
//!   manager existed), the catalog: every node (`AddNode`), every chunk of every replicated
//!   volume on its replicas (`AdoptChunk`), every node's usage (`Report`);
//! - a new volume's chunks (`PlaceChunkAt`, at the leader's time): the replicas are those the
//!   committed state chose, among the nodes whose reports are fresh;
//! - the claim on moves (`Claim`, `Release`: one mover at a time, leased for [`CLAIM_TTL`]
//!   after its last renewal) and the background rebalancer's last round (`RecordRound`), so
//!   that both outlive the leader;
//! - a drain (`DrainNode`, then the next move off the node as the leader's plan of its own
//!   state chooses) and each move's `BeginMove` and `FinishMove` or `AbortMove`
//!   (migrate.rs enters a move in the catalogs first and ends it there first, so whatever the
//!   manager holds in flight is in the catalogs too);
//! - a member of its own group silent for `[cluster] manager_replace_after`, replaced by an
//!   up node (manager_members.rs, from the leader's report round);
//! - moves its state holds in flight that the catalogs ended while no leader heard (its
//!   leader died mid-move): ended as the catalogs say. A move the catalogs still list is
//!   settled by migrate.rs's `settle` (at a node's start, before a drain or a move), which
//!   tells the manager how it ended.
//!
//! The catalog on each node stays what the data path reads; the manager's state is the
//! decisions' view. Without a quorum of its members the manager answers nothing, and
//! placement and drains are refused with an error that names the members and how many are up.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
pub use tundra_cluster::MoveOwner;
use tundra_cluster::mover::{REPORT_REFRESH_MS, REPORT_STALE_AFTER_MS, report_stale};
use tundra_cluster::{
    ClusterState, Command, MAX_SIZES_PER_COMMAND, Move, MoveReason, NodeId, NodeStatus as ManagedStatus, ReportedSize,
    Space,
};
use tundra_raft::manager_machine::{ManagerBug, SnapshotStore, manager_group};
use tundra_store::ids::{ChunkId, VolumeId};

use crate::cluster::{ClusterNode, chunk_spans};
use crate::messages::{Answer, ChunkMove, ChunkSize, Forward, NodeUsage, Refusal};

/// The manager member's snapshot, in the data directory.
pub const SNAPSHOT_FILE: &str = "manager.snapshot";
/// How often a node reports its usage (when it changed).
pub const REPORT_EVERY: Duration = Duration::from_secs(1);
/// How long a call waits for the manager's leader before it is refused.
const MANAGER_WAIT: Duration = Duration::from_secs(10);
/// How long the leader waits to have applied its whole log.
pub(crate) const SETTLE_LIMIT: Duration = Duration::from_secs(5);
/// Entries between two snapshots of the manager's state.
const LOGS_PER_SNAPSHOT: u64 = 1024;
/// How long a status waits for the manager.
/// How long a rebuild of the manager's empty state waits for one node's usage.
const RECONCILE_ASK_WAIT: Duration = Duration::from_secs(2);
const STATUS_WAIT: Duration = Duration::from_secs(2);
/// A node measures the chunks it leads every this many reports: measuring a chunk reads every
/// index entry of it, so not every second.
const SIZES_EVERY_REPORTS: u64 = 5;
/// Every this many reports a node sends its usage and every chunk size again, acknowledged or
/// not: a manager state rebuilt from the catalogs, or a leader that missed a report, has them
/// again within this bound.
const FULL_REPORT_EVERY: u64 = 60;
/// How long a claim on moves lasts after its last renewal: past the longest move (a catch-up
/// of [`crate::migrate::CATCH_UP_LIMIT`] and its pacing), so a holder that died frees it.
pub const CLAIM_TTL: Duration = Duration::from_secs(120);
/// How long a mover waits for another's claim to end before it is refused.
const CLAIM_WAIT: Duration = Duration::from_secs(60);

/// The snapshot file: replaced whole (written beside, synced, renamed, the directory synced).
pub struct FileSnapshots {
    pub path: PathBuf,
}

impl SnapshotStore for FileSnapshots {
    fn load(&self) -> Result<Option<Vec<u8>>, String> {
        match std::fs::read(&self.path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("{}: {e}", self.path.display())),
        }
    }

    fn save(&self, bytes: &[u8]) -> Result<(), String> {
        use std::io::Write;
        let fail = |e: std::io::Error| format!("{}: {e}", self.path.display());
        let next = self.path.with_extension("next");
        let mut file = std::fs::File::create(&next).map_err(fail)?;
        file.write_all(bytes).map_err(fail)?;
        file.sync_all().map_err(fail)?;
        std::fs::rename(&next, &self.path).map_err(fail)?;
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(fail)?;
        }
        Ok(())
    }
}

/// Milliseconds since the Unix epoch on this node's clock: the time the leader writes in
/// `Report`, `PlaceChunkAt` and `Claim` commands.
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A test-only hook: `TUNDRA_TEST_CLAIM_IN_MEMORY=1` keeps the claim on moves and the last
/// round in the manager leader's memory, as before they were replicated (the twin of the
/// failover test: a new leader then lets a second mover in). Unset in production.
pub(crate) fn claim_in_memory() -> bool {
    std::env::var("TUNDRA_TEST_CLAIM_IN_MEMORY").is_ok_and(|v| v == "1")
}

/// [`CLAIM_TTL`], or `TUNDRA_TEST_CLAIM_TTL_MS` (a test-only hook, so that a test sees a dead
/// holder's claim lapse).
fn claim_ttl() -> Duration {
    let ttl = std::env::var("TUNDRA_TEST_CLAIM_TTL_MS").ok().and_then(|v| v.parse::<u64>().ok());
    ttl.map_or(CLAIM_TTL, Duration::from_millis)
}

/// [`CLAIM_WAIT`], or `TUNDRA_TEST_CLAIM_WAIT_MS` (a test-only hook, so that a refused mover
/// is refused within a test's time).
fn claim_wait() -> Duration {
    let wait = std::env::var("TUNDRA_TEST_CLAIM_WAIT_MS").ok().and_then(|v| v.parse::<u64>().ok());
    wait.map_or(CLAIM_WAIT, Duration::from_millis)
}

/// What a node asks of the manager's leader.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ManagerCall {
    /// A node's drive usage.
    Report {
        node: u64,
        usage: NodeUsage,
    },
    /// Place a new chunk; answers its replicas (those already chosen, asked again).
    Place {
        chunk: u64,
        expected_logical_bytes: u64,
        replicas: usize,
    },
    /// Propose one command (its versioned encoding).
    Propose(Vec<u8>),
    /// Mark the node draining and plan the next move off it; answers the chunks it holds and
    /// the move (none when no node can take them).
    PlanDrain {
        node: u64,
    },
    Status,
    /// The sizes of chunks whose groups `node` leads that changed since the manager last
    /// acknowledged them (at most [`tundra_cluster::MAX_SIZES_PER_COMMAND`]).
    Sizes {
        node: u64,
        sizes: Vec<ChunkSize>,
    },
    /// Every chunk size the manager's state holds from the nodes' reports.
    ChunkSizes,
    /// Take (or renew) the right to make moves, held for [`CLAIM_TTL`] after the last renewal:
    /// one mover at a time across the cluster (a background round, a `tundra cluster
    /// rebalance` run, a drain, a single move).
    Claim {
        owner: MoveOwner,
    },
    /// Give the right back (nothing happens when `owner` does not hold it).
    Release {
        owner: MoveOwner,
    },
    /// The leader's whole state (a snapshot's encoding) and its clock: what every decision
    /// (a plan, a placement's thin-provisioning share) is made from.
    State,
    /// The background rebalancer's round record, written to the state.
    RecordRound(tundra_cluster::RoundRecord),
    /// `drained` holds no chunk any more: if it is a member of the manager's group, give its
    /// place to an up node that is not one (manager_members.rs).
    ReplaceMember {
        drained: u64,
    },
    /// Whether `node` is still in the manager's group (a voter, a learner, or being added):
    /// asked by a node whose member's log says it is a voter (manager_members.rs).
    MemberCheck {
        node: u64,
    },
}

/// One chunk's size as the manager's state holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManagedSize {
    pub chunk: u64,
    pub logical_bytes: u64,
    pub physical_bytes: u64,
}

/// The manager leader's answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ManagerReply {
    Done,
    Replicas(Vec<u64>),
    /// Boxed: the status is far larger than every other answer.
    Status(Box<ManagerStatus>),
    DrainPlan {
        held: Vec<u64>,
        next: Option<Move>,
    },
    ChunkSizes(Vec<ManagedSize>),
    /// The claim was taken or renewed.
    Claimed,
    /// Another owner holds the claim (said in words).
    Busy(String),
    /// The leader's state ([`ClusterState::encode`]) and its clock when it answered.
    State {
        bytes: Vec<u8>,
        now_unix_ms: u64,
    },
    /// The answer to `MemberCheck`.
    Member(bool),
}

/// The manager as `tundra cluster status --json` shows it (`manager`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ManagerStatus {
    pub members: Vec<u64>,
    pub leader: Option<u64>,
    pub term: u64,
    pub applied_index: Option<u64>,
    /// The state's nodes: id, status, chunk replicas.
    pub nodes: Vec<ManagedNode>,
    pub chunks: usize,
    pub moves_in_flight: Vec<ChunkMoveView>,
    /// How many chunks the state holds a reported size for (`ChunkSizes` from the nodes'
    /// reports).
    pub chunks_sized: usize,
    /// The background rebalancer of the leader that answered (background.rs); its
    /// `last_round` is the replicated one.
    pub background_rebalance: Box<crate::background::BackgroundStatus>,
    /// Who holds the claim on moves, from the replicated state (null: nobody, or it lapsed).
    #[serde(default)]
    pub claim: Option<ClaimView>,
    /// Active nodes whose last report is older than `report_stale_after_ms`: unknown to
    /// placement and plans (neither given nor taking chunks) until they report again.
    #[serde(default)]
    pub unknown_nodes: Vec<u64>,
    #[serde(default)]
    pub report_stale_after_ms: u64,
    /// The group's learners (a member being added).
    #[serde(default)]
    pub learners: Vec<u64>,
    /// `[cluster] manager_replace_after` of the leader that answered, in milliseconds (null:
    /// off): a voter silent this long is replaced (manager_members.rs).
    #[serde(default)]
    pub replace_after_ms: Option<u64>,
    /// The last silent member this leader replaced since it started.
    #[serde(default)]
    pub last_replacement: Option<crate::manager_members::MemberReplacement>,
    /// The repair of dead nodes' replicas by the leader that answered (dead_nodes.rs):
    /// `after_ms` (`[cluster] repair_after`, null: off), `repairing` (dead nodes still holding
    /// replicas), `blocked` (why some stay), `moves_total`, `failures_total`, `last_repair`.
    #[serde(default)]
    pub repair: crate::dead_nodes::RepairStatus,
    /// Why the manager did not answer (then every other figure is empty).
    pub error: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ManagedNode {
    pub id: u64,
    pub status: String,
    pub chunks: usize,
    /// How long ago the node's last report was written (null: none with a time yet).
    #[serde(default)]
    pub report_age_ms: Option<u64>,
    /// Its report is stale: unknown to placement and plans.
    #[serde(default)]
    pub unknown: bool,
}

/// The claim on moves as status shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimView {
    /// The holder, in words.
    pub owner: String,
    pub taken_unix_ms: u64,
    pub until_unix_ms: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ChunkMoveView {
    pub volume_id: u32,
    pub chunk: u32,
    pub from: u64,
    pub to: u64,
}

fn refusal(error: tundra_raft::Error) -> Refusal {
    crate::io::refusal(error)
}

fn invalid(error: tundra_cluster::Error) -> Refusal {
    Refusal::Invalid(error.to_string())
}

impl ClusterNode {
    /// Starts this node's member of the manager group if it is one, and the usage reports;
    /// the lowest member makes the members the group's first membership if its log is empty.
    pub(crate) fn start_manager(self: &Arc<ClusterNode>) -> Result<(), String> {
        if self.is_manager_member_at_start() {
            let members = self.membership.managers.clone();
            let store = Arc::new(FileSnapshots { path: self.node.data_dir().join(SNAPSHOT_FILE) });
            self.block_on(self.host.add_manager_group(store, None, ManagerBug::None, LOGS_PER_SNAPSHOT))?;
            let raft = self.host.raft(manager_group()).map_err(|e| e.to_string())?;
            let empty = raft.metrics().borrow().last_log_index.is_none()
                && self.host.manager_view().is_some_and(|v| v.lock().applied.is_none());
            if empty && members.first() == Some(&self.me) {
                // Refused when the group has a membership already.
                let _ = self.block_on(self.host.initialize(manager_group(), members.iter().copied().collect()));
            }
        }
        let weak = Arc::downgrade(self);
        self.spawn(async move {
            let mut reporter = Reporter::default();
            loop {
                tokio::time::sleep(REPORT_EVERY).await;
                let Some(node) = weak.upgrade() else { return };
                node.report_once(&mut reporter).await;
            }
        });
        // On the manager's leader, the placements no volume came to use (abandoned.rs), apart
        // from the reports: asking every node's catalog must not hold this node's report back.
        let weak = Arc::downgrade(self);
        self.spawn(async move {
            loop {
                tokio::time::sleep(REPORT_EVERY).await;
                let Some(node) = weak.upgrade() else { return };
                if node.local_leader(manager_group()) == Some(node.me) {
                    node.forget_abandoned().await;
                } else {
                    *node.placements.lock() = crate::abandoned::Watch::default();
                }
            }
        });
        crate::background::start(self);
        Ok(())
    }

    /// One round of the reporter: the sizes of the chunks this node leads that changed (every
    /// [`SIZES_EVERY_REPORTS`] rounds), then this node's usage (every round: the leader writes
    /// it when it changed or to keep its time fresh), and on the leader
    /// the moves its state holds in flight that the catalogs ended already. Sizes go first,
    /// so that the usage's part beyond the chunks (the overhead) is counted against them.
    async fn report_once(&self, reporter: &mut Reporter) {
        reporter.round += 1;
        if reporter.round % FULL_REPORT_EVERY == 1 {
            reporter.usage = None;
            reporter.sizes.clear();
        }
        if reporter.round % SIZES_EVERY_REPORTS == 1 {
            let led = self.led_chunk_sizes();
            let changed = reporter.changed(&led);
            if !changed.is_empty() {
                let call = ManagerCall::Sizes { node: self.me, sizes: changed.clone() };
                if self.to_manager_within(call, REPORT_EVERY * 3).await.is_ok() {
                    reporter.acknowledged(&changed);
                }
            }
        }
        let usage = self.usage();
        let call = ManagerCall::Report { node: self.me, usage };
        if self.to_manager_within(call, REPORT_EVERY * 3).await.is_ok() {
            reporter.usage = Some(usage);
        }
        if self.local_leader(manager_group()) == Some(self.me) {
            let _ = self.end_settled_moves().await;
            self.replace_silent_member().await;
        } else if self.host.manager_view().is_some() {
            self.retire_if_replaced(reporter.round).await;
        }
    }

    /// Sends `call` to the manager's leader, asked again through failovers for up to
    /// [`MANAGER_WAIT`]; then refused with who is up.
    pub async fn to_manager(&self, call: ManagerCall) -> Result<ManagerReply, Refusal> {
        self.to_manager_within(call, MANAGER_WAIT).await
    }

    pub(crate) async fn to_manager_within(&self, call: ManagerCall, wait: Duration) -> Result<ManagerReply, Refusal> {
        // The configured members first, then every other node: a drain may have given a
        // member's place to another node (manager_members.rs), and a member that is not the
        // leader names the leader.
        let configured = self.membership.managers.clone();
        let mut members = configured.clone();
        members.extend(self.membership.ids().into_iter().filter(|id| !configured.contains(id)));
        let deadline = tokio::time::Instant::now() + wait;
        let mut hint: Option<u64> = None;
        let mut attempt = 0usize;
        let last = loop {
            attempt += 1;
            let local = self.local_leader(manager_group());
            let guess = hint.take().or(local).unwrap_or(members[attempt % members.len()]);
            let asked = tokio::time::timeout(SETTLE_LIMIT * 2, self.ask(guess, Forward::Manager(call.clone()))).await;
            let last = match asked {
                Ok(Ok(Answer::Manager(reply))) => return Ok(reply),
                Ok(Ok(other)) => return Err(Refusal::Unavailable(format!("the manager answered {other:?}"))),
                Ok(Err(Refusal::Invalid(why))) => return Err(Refusal::Invalid(why)),
                Ok(Err(Refusal::NotLeader { leader })) => {
                    hint = leader.filter(|l| members.contains(l));
                    format!("node {guess} does not lead the manager")
                }
                Ok(Err(Refusal::Unavailable(why))) => why,
                Err(_) => format!("node {guess} did not answer"),
            };
            if tokio::time::Instant::now() >= deadline {
                break last;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let mut up = Vec::new();
        for &member in &configured {
            let alive = tokio::time::timeout(Duration::from_secs(1), self.ask(member, Forward::Usage)).await;
            if matches!(alive, Ok(Ok(_))) {
                up.push(member.to_string());
            }
        }
        let list: Vec<String> = configured.iter().map(u64::to_string).collect();
        Err(Refusal::Unavailable(format!(
            "the cluster manager has no quorum: members {}, up: {} ({last})",
            list.join(","),
            if up.is_empty() { "none".to_string() } else { up.join(",") }
        )))
    }

    /// The leader's side of a manager call.
    pub(crate) async fn lead_manager(&self, call: ManagerCall) -> Result<Answer, Refusal> {
        let group = manager_group();
        let Some(view) = self.host.manager_view() else {
            return Err(Refusal::NotLeader { leader: None });
        };
        if let ManagerCall::Status = call {
            // A member that knows another leader sends the caller there.
            return match self.local_leader(group) {
                Some(leader) if leader != self.me => Err(Refusal::NotLeader { leader: Some(leader) }),
                _ => Ok(Answer::Manager(ManagerReply::Status(Box::new(self.manager_status_here())))),
            };
        }
        if let ManagerCall::MemberCheck { node } = call {
            // Without the manager's turn: a replacement holds it while it waits for the node
            // it adds, which may be asking this (manager_members.rs).
            return match self.local_leader(group) {
                Some(leader) if leader == self.me => {
                    self.host.settle(group, SETTLE_LIMIT).await.map_err(refusal)?;
                    Ok(Answer::Manager(ManagerReply::Member(self.is_member_now(node)?)))
                }
                leader => Err(Refusal::NotLeader { leader }),
            };
        }
        if let ManagerCall::ChunkSizes | ManagerCall::State = call {
            return match self.local_leader(group) {
                Some(leader) if leader == self.me => {
                    self.host.settle(group, SETTLE_LIMIT).await.map_err(refusal)?;
                    let state = &view.lock().state;
                    Ok(Answer::Manager(match call {
                        ManagerCall::State => ManagerReply::State { bytes: state.encode(), now_unix_ms: now_unix_ms() },
                        _ => ManagerReply::ChunkSizes(managed_sizes(state)),
                    }))
                }
                leader => Err(Refusal::NotLeader { leader }),
            };
        }
        let _turn = self.manager_turn.lock().await;
        self.host.settle(group, SETTLE_LIMIT).await.map_err(refusal)?;
        // The only place the manager asks the nodes themselves: a state with no node at all
        // (a cluster's first leader, or a cluster older than its manager) is rebuilt from the
        // catalog and every node's usage; every decision after reads the replicated state.
        if view.lock().state.nodes().is_empty() {
            self.reconcile().await?;
        }
        let reply = match call {
            ManagerCall::Status | ManagerCall::ChunkSizes | ManagerCall::State | ManagerCall::MemberCheck { .. } => {
                unreachable!("answered above")
            }
            ManagerCall::Report { node, usage } => {
                self.take_report(node, usage).await?;
                ManagerReply::Done
            }
            ManagerCall::ReplaceMember { drained } => self.replace_member(drained).await?,
            ManagerCall::RecordRound(record) => {
                if !claim_in_memory() {
                    self.propose(Command::RecordRound(record.bounded())).await?;
                }
                ManagerReply::Done
            }
            ManagerCall::Sizes { node, sizes } => {
                self.take_sizes(node, &sizes).await?;
                ManagerReply::Done
            }
            ManagerCall::Claim { owner } if claim_in_memory() => self.claim_here(owner),
            ManagerCall::Claim { owner } => {
                let at_unix_ms = now_unix_ms();
                let busy = view.lock().state.claim().copied().filter(|c| c.owner != owner && c.holds_at(at_unix_ms));
                match busy {
                    Some(held) => ManagerReply::Busy(format!(
                        "{} is making moves (its claim lasts {} s more unless renewed)",
                        held.owner,
                        (held.until_unix_ms - at_unix_ms).div_ceil(1000)
                    )),
                    None => {
                        let lease_ms = claim_ttl().as_millis() as u64;
                        match self.propose(Command::Claim { owner, at_unix_ms, lease_ms }).await {
                            Ok(()) => ManagerReply::Claimed,
                            Err(Refusal::Invalid(why)) => ManagerReply::Busy(why),
                            Err(other) => return Err(other),
                        }
                    }
                }
            }
            ManagerCall::Release { owner } if claim_in_memory() => {
                let mut claim = self.move_claim.lock();
                if claim.is_some_and(|(holder, _)| holder == owner) {
                    *claim = None;
                }
                ManagerReply::Done
            }
            ManagerCall::Release { owner } => {
                if view.lock().state.claim().is_some_and(|c| c.owner == owner) {
                    self.propose(Command::Release { owner }).await?;
                }
                ManagerReply::Done
            }
            ManagerCall::Place { chunk, expected_logical_bytes, replicas } => {
                let configured = view.lock().state.config().replicas;
                if replicas != configured {
                    return Err(Refusal::Invalid(format!(
                        "{replicas} replicas asked, and the cluster manager places {configured} of each chunk"
                    )));
                }
                let chunk = ChunkId(chunk);
                // The chunk's grace as a placement no volume uses starts now (abandoned.rs).
                self.placements.lock().placed(chunk);
                if view.lock().state.chunk(chunk).is_none() {
                    let at_unix_ms = now_unix_ms();
                    self.propose(Command::PlaceChunkAt { chunk, expected_logical_bytes, at_unix_ms }).await?;
                }
                let state = &view.lock().state;
                let placed = state.chunk(chunk).ok_or_else(|| Refusal::Unavailable("the placement vanished".into()))?;
                ManagerReply::Replicas(placed.replicas.iter().map(|n| n.0).collect())
            }
            ManagerCall::PlanDrain { node } => {
                self.propose(Command::DrainNode { node: NodeId(node) }).await?;
                // The plan is a query of the leader's applied state (seed 000 §4.2): the node's
                // chunks go, one move at a time, where the drain rule sends them.
                let state = view.lock().state.clone();
                let held: Vec<u64> =
                    state.node(NodeId(node)).map(|n| n.chunks.iter().map(|c| c.0).collect()).unwrap_or_default();
                let next = state.plan().moves.into_iter().find(|m| m.from == NodeId(node));
                ManagerReply::DrainPlan { held, next }
            }
            ManagerCall::Propose(bytes) => {
                let command = Command::decode(&bytes).map_err(invalid)?;
                self.propose(command).await?;
                ManagerReply::Done
            }
        };
        Ok(Answer::Manager(reply))
    }

    /// As the leader: `node`'s report written as a timed `Report` when a figure the state keeps
    /// moved or its last one is older than [`REPORT_REFRESH_MS`] (an unknown node is added
    /// first).
    async fn take_report(&self, node: u64, usage: NodeUsage) -> Result<(), Refusal> {
        let Some(view) = self.host.manager_view() else { return Ok(()) };
        let (capacity, used) = spaces(&usage);
        let at_unix_ms = now_unix_ms();
        let report = Command::Report { node: NodeId(node), capacity, used, overcommit: usage.overcommit, at_unix_ms };
        let due = {
            let state = &view.lock().state;
            state.node(NodeId(node)).map(|n| {
                n.capacity != capacity
                    || n.overhead != used.saturating_minus(n.actual_chunk_space())
                    || n.reported_used != Some(used)
                    || n.overcommit != usage.overcommit
                    || n.reported_unix_ms.is_none_or(|at| at_unix_ms.saturating_sub(at) >= REPORT_REFRESH_MS)
            })
        };
        match due {
            None => {
                self.propose(Command::AddNode { node: NodeId(node), capacity }).await?;
                self.propose(report).await
            }
            Some(true) => self.propose(report).await,
            Some(false) => Ok(()),
        }
    }

    /// As the leader: the sizes `node` measured of the chunks it leads, proposed as one
    /// `ChunkSizes` command (seed 000 §4.2.2: the per-chunk ratios the scheduler reads). Only
    /// sizes that changed, of chunks the state knows with a replica on `node` that is not a
    /// move's target still catching up. Then each replica's node with a timed report in the
    /// state is reported again, with the same usage and time, if its overhead (usage beyond
    /// its chunks) moved with the new sizes.
    async fn take_sizes(&self, node: u64, sizes: &[ChunkSize]) -> Result<(), Refusal> {
        let Some(view) = self.host.manager_view() else { return Ok(()) };
        if sizes.len() > MAX_SIZES_PER_COMMAND {
            return Err(Refusal::Invalid(format!(
                "{} chunk sizes in one report, past {MAX_SIZES_PER_COMMAND}",
                sizes.len()
            )));
        }
        let (changed, touched) = {
            let state = &view.lock().state;
            let mut changed = Vec::new();
            let mut touched = std::collections::BTreeSet::new();
            for s in sizes {
                let chunk = ChunkId::new(VolumeId(s.volume), s.chunk);
                let size = Space::new(s.logical_bytes, s.physical_bytes);
                let Some(c) = state.chunk(chunk) else { continue };
                let catching_up = c.moving.is_some_and(|m| m.to == NodeId(node));
                if !c.replicas.contains(&NodeId(node)) || catching_up || c.reported == Some(size) {
                    continue;
                }
                if changed.iter().any(|r: &ReportedSize| r.chunk == chunk) {
                    continue;
                }
                changed.push(ReportedSize { chunk, size });
                touched.extend(c.replicas.iter().map(|n| n.0));
                if let Some(m) = c.moving {
                    touched.insert(m.from.0);
                }
            }
            (changed, touched)
        };
        if changed.is_empty() {
            return Ok(());
        }
        self.propose(Command::ChunkSizes { node: NodeId(node), sizes: changed }).await?;
        for other in touched {
            let again = {
                let state = &view.lock().state;
                state.node(NodeId(other)).and_then(|n| {
                    let (used, at_unix_ms) = (n.reported_used?, n.reported_unix_ms?);
                    (n.overhead != used.saturating_minus(n.actual_chunk_space())).then_some(Command::Report {
                        node: NodeId(other),
                        capacity: n.capacity,
                        used,
                        overcommit: n.overcommit,
                        at_unix_ms,
                    })
                })
            };
            if let Some(report) = again {
                self.propose(report).await?;
            }
        }
        Ok(())
    }

    /// As the leader: the claim on moves for `owner`, unless another holds it.
    fn claim_here(&self, owner: MoveOwner) -> ManagerReply {
        let mut claim = self.move_claim.lock();
        let now = std::time::Instant::now();
        match *claim {
            Some((holder, until)) if holder != owner && until > now => {
                let left = until.duration_since(now).as_secs();
                ManagerReply::Busy(format!("{holder} is making moves (its claim lasts {left} s more unless renewed)"))
            }
            _ => {
                *claim = Some((owner, now + claim_ttl()));
                ManagerReply::Claimed
            }
        }
    }

    /// Takes the claim on moves for `owner`, waiting up to [`CLAIM_WAIT`] for another owner's
    /// to end.
    pub(crate) async fn claim_moves(&self, owner: MoveOwner) -> Result<(), Refusal> {
        let wait = claim_wait();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match self.to_manager(ManagerCall::Claim { owner }).await? {
                ManagerReply::Claimed => return Ok(()),
                ManagerReply::Busy(_) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                ManagerReply::Busy(why) => {
                    return Err(Refusal::Unavailable(format!(
                        "one mover at a time: {why}; waited {} s, try again later",
                        wait.as_secs()
                    )));
                }
                other => return Err(Refusal::Unavailable(format!("a claim on moves answered {other:?}"))),
            }
        }
    }

    /// Gives the claim on moves back (a lost answer leaves it to expire).
    pub(crate) async fn release_moves(&self, owner: MoveOwner) {
        let _ = self.to_manager(ManagerCall::Release { owner }).await;
    }

    /// The space of every chunk whose group this node leads (not the volumes' redo groups nor
    /// the manager's).
    fn led_chunk_sizes(&self) -> Vec<ChunkSize> {
        let led: Vec<ChunkId> = self
            .host
            .groups()
            .into_iter()
            .filter(|&group| {
                tundra_raft::manager_machine::is_chunk_group(group) && self.local_leader(group) == Some(self.me)
            })
            .collect();
        tokio::task::block_in_place(|| led.into_iter().map(|chunk| self.chunk_size(chunk)).collect())
    }

    /// Proposes one command here, as the leader; a refusal is the state's.
    async fn propose(&self, command: Command) -> Result<(), Refusal> {
        self.host.propose_bytes(manager_group(), command.encode()).await.map_err(refusal)
    }

    /// An empty state rebuilt from this leader's catalog and every node's usage: all nodes
    /// must answer.
    async fn reconcile(&self) -> Result<(), Refusal> {
        // A volume being deleted is not adopted (delete.rs).
        let defs: Vec<_> = self.catalog.lock().volumes().iter().filter(|def| !def.deleting).cloned().collect();
        // Every node that holds a catalogued replica must answer (its chunks are adopted with
        // it); a node holding none (all of them in a new cluster) may be down: it enters the
        // state with its first report (`take_report`), so a cluster started with a node down
        // can still place volumes on the others.
        let holders: BTreeSet<u64> = defs
            .iter()
            .flat_map(|def| {
                (0..chunk_spans(def.size_bytes).len() as u32).flat_map(|i| def.replicas_of(i).iter().copied())
            })
            .collect();
        let mut usage = Vec::new();
        for node in self.membership.ids() {
            match tokio::time::timeout(RECONCILE_ASK_WAIT, self.ask(node, Forward::Usage)).await {
                Ok(Ok(Answer::Usage(u))) => usage.push((node, u)),
                _ if !holders.contains(&node) => {}
                _ => {
                    return Err(Refusal::Unavailable(format!(
                        "the manager's state is empty and node {node}, which holds replicas, does not answer to rebuild it"
                    )));
                }
            }
        }
        for (node, u) in &usage {
            self.propose(Command::AddNode { node: NodeId(*node), capacity: spaces(u).0 }).await?;
        }
        for def in defs {
            for (index, bytes) in chunk_spans(def.size_bytes).into_iter().enumerate() {
                let replicas = def.replicas_of(index as u32).iter().map(|&n| NodeId(n)).collect();
                let chunk = ChunkId::new(VolumeId(def.id), index as u32);
                self.propose(Command::AdoptChunk { chunk, replicas, expected_logical_bytes: bytes }).await?;
            }
        }
        for (node, u) in &usage {
            let (capacity, used) = spaces(u);
            let at_unix_ms = now_unix_ms();
            let overcommit = u.overcommit;
            self.propose(Command::Report { node: NodeId(*node), capacity, used, overcommit, at_unix_ms }).await?;
        }
        Ok(())
    }

    /// The manager leader's replicated state and its clock: the one source of decisions
    /// (rebalance.rs's `decision_state`, a volume's placement).
    pub(crate) async fn manager_state_now(&self) -> Result<(ClusterState, u64), Refusal> {
        match self.to_manager(ManagerCall::State).await? {
            ManagerReply::State { bytes, now_unix_ms } => {
                let state = ClusterState::decode(&bytes).map_err(|e| {
                    Refusal::Unavailable(format!("the manager's state does not decode here: {}", e.message()))
                })?;
                Ok((state, now_unix_ms))
            }
            other => Err(Refusal::Unavailable(format!("the manager's state answered {other:?}"))),
        }
    }

    /// Proposes `command` through the manager's leader, from any node.
    pub(crate) async fn manager_command(&self, command: &Command) -> Result<(), Refusal> {
        self.to_manager(ManagerCall::Propose(command.encode())).await.map(|_| ())
    }

    /// The manager's replicas for each chunk of a new volume, placed in order.
    pub(crate) async fn manager_place(
        &self,
        volume: u32,
        expected: &[u64],
        replicas: usize,
    ) -> Result<Vec<Vec<u64>>, Refusal> {
        let mut sets = Vec::with_capacity(expected.len());
        for (index, &bytes) in expected.iter().enumerate() {
            let chunk = ChunkId::new(VolumeId(volume), index as u32).0;
            match self.to_manager(ManagerCall::Place { chunk, expected_logical_bytes: bytes, replicas }).await? {
                ManagerReply::Replicas(mut set) => {
                    set.sort_unstable();
                    sets.push(set);
                }
                other => return Err(Refusal::Unavailable(format!("a placement answered {other:?}"))),
            }
        }
        Ok(sets)
    }

    /// The chunks `node` holds and the next move off it, as the manager's leader plans them
    /// once it marked the node draining.
    pub(crate) async fn manager_drain_plan(&self, node: u64) -> Result<(Vec<ChunkId>, Option<Move>), Refusal> {
        match self.to_manager(ManagerCall::PlanDrain { node }).await? {
            ManagerReply::DrainPlan { held, next } => Ok((held.into_iter().map(ChunkId).collect(), next)),
            other => Err(Refusal::Unavailable(format!("a drain plan answered {other:?}"))),
        }
    }

    /// A move the catalogs entered, begun in the manager's state.
    pub(crate) async fn manager_begin(&self, volume: u32, moving: ChunkMove) -> Result<(), Refusal> {
        let chunk = ChunkId::new(VolumeId(volume), moving.chunk);
        let planned = Move { chunk, from: NodeId(moving.from), to: NodeId(moving.to), reason: MoveReason::Drain };
        self.manager_command(&Command::BeginMove(planned)).await
    }

    /// A move the catalogs ended, ended in the manager's state; a move the manager no longer
    /// holds in flight (a new leader ended it already) is left alone.
    pub(crate) async fn manager_end(&self, volume: u32, moving: ChunkMove, finished: bool) {
        let chunk = ChunkId::new(VolumeId(volume), moving.chunk);
        let command = if finished { Command::FinishMove { chunk } } else { Command::AbortMove { chunk } };
        let _ = self.manager_command(&command).await;
    }

    /// On the leader: the moves its state holds in flight whose catalog entry is gone (their
    /// coordinator, or migrate.rs's `settle` at a node's start or a drain, ended them, and the
    /// manager's leader died before it heard), ended as the catalog says. A move the catalog
    /// still lists is left to whoever settles it there: settling it here could race its
    /// coordinator, still at work.
    async fn end_settled_moves(&self) -> Result<(), Refusal> {
        let Some(view) = self.host.manager_view() else { return Ok(()) };
        let moves: Vec<Move> = view.lock().state.moves_in_flight().copied().collect();
        for m in moves {
            let (volume, index) = (m.chunk.volume().0, m.chunk.index());
            let def = self.catalog.lock().get(volume).cloned();
            let finished = match def {
                None => false,
                Some(def) if def.move_of(index).is_some() => continue,
                Some(def) => def.holds(m.to.0, index),
            };
            let chunk = m.chunk;
            let command = if finished { Command::FinishMove { chunk } } else { Command::AbortMove { chunk } };
            self.manager_command(&command).await?;
        }
        Ok(())
    }

    /// This member's view of the manager.
    fn manager_status_here(&self) -> ManagerStatus {
        let mut status = ManagerStatus { members: self.membership.managers.clone(), ..Default::default() };
        let (Ok(raft), Some(view)) = (self.host.raft(manager_group()), self.host.manager_view()) else {
            status.error = Some(format!("node {} is not a member of the manager", self.me));
            return status;
        };
        let metrics = raft.metrics().borrow().clone();
        status.leader = metrics.current_leader;
        status.term = metrics.current_term;
        status.members = metrics.membership_config.membership().voter_ids().collect();
        status.learners = metrics.membership_config.membership().learner_ids().collect();
        status.replace_after_ms = self.manager_replace_after.map(|after| after.as_millis() as u64);
        status.last_replacement = self.member_work.last.lock().clone();
        status.repair = self.repair.status.lock().clone();
        let view = view.lock();
        status.applied_index = view.applied.map(|id| id.index);
        let state = &view.state;
        let now = now_unix_ms();
        status.report_stale_after_ms = REPORT_STALE_AFTER_MS;
        status.nodes = state
            .nodes()
            .iter()
            .map(|(id, n)| ManagedNode {
                id: id.0,
                status: match n.status {
                    ManagedStatus::Active => "active",
                    ManagedStatus::Draining => "draining",
                    ManagedStatus::Dead => "dead",
                }
                .into(),
                chunks: n.chunks.len(),
                report_age_ms: n.reported_unix_ms.map(|at| now.saturating_sub(at)),
                unknown: n.status == ManagedStatus::Active && report_stale(n.reported_unix_ms, now),
            })
            .collect();
        status.unknown_nodes = status.nodes.iter().filter(|n| n.unknown).map(|n| n.id).collect();
        status.chunks = state.chunks().len();
        status.chunks_sized = state.chunks().values().filter(|c| c.reported.is_some()).count();
        let mut background = self.background.lock().clone();
        if claim_in_memory() {
            status.claim = self.move_claim.lock().and_then(|(owner, until)| {
                let left = until.checked_duration_since(std::time::Instant::now())?;
                Some(ClaimView {
                    owner: owner.to_string(),
                    taken_unix_ms: 0,
                    until_unix_ms: now + left.as_millis() as u64,
                })
            });
        } else {
            background.last_round = state.last_round().cloned();
            status.claim = state.claim().filter(|c| c.holds_at(now)).map(|c| ClaimView {
                owner: c.owner.to_string(),
                taken_unix_ms: c.taken_unix_ms,
                until_unix_ms: c.until_unix_ms,
            });
        }
        status.background_rebalance = Box::new(background);
        status.moves_in_flight = state
            .moves_in_flight()
            .map(|m| ChunkMoveView {
                volume_id: m.chunk.volume().0,
                chunk: m.chunk.index(),
                from: m.from.0,
                to: m.to.0,
            })
            .collect();
        status
    }

    /// The manager as its leader sees it (or why it does not answer), for the status.
    pub(crate) async fn manager_status(&self) -> ManagerStatus {
        match self.to_manager_within(ManagerCall::Status, STATUS_WAIT).await {
            Ok(ManagerReply::Status(status)) if status.leader.is_some() => *status,
            Ok(ManagerReply::Status(mut status)) => {
                status.error.get_or_insert_with(|| "the manager has no leader".into());
                *status
            }
            Ok(other) => ManagerStatus { error: Some(format!("answered {other:?}")), ..Default::default() },
            Err(why) => ManagerStatus {
                members: self.membership.managers.clone(),
                error: Some(format!("{why:?}")),
                ..Default::default()
            },
        }
    }
}

/// What a node's reporter remembers between rounds.
#[derive(Default)]
struct Reporter {
    round: u64,
    /// The usage the manager acknowledged last.
    usage: Option<NodeUsage>,
    /// The chunk sizes it acknowledged, by chunk id: (logical, physical bytes).
    sizes: std::collections::BTreeMap<u64, (u64, u64)>,
}

impl Reporter {
    /// The sizes in `led` not acknowledged as they are, at most [`MAX_SIZES_PER_COMMAND`] (the
    /// rest go in later rounds); forgets the chunks no longer led, so that a chunk whose
    /// leadership comes back is reported again.
    fn changed(&mut self, led: &[ChunkSize]) -> Vec<ChunkSize> {
        let id = |s: &ChunkSize| ChunkId::new(VolumeId(s.volume), s.chunk).0;
        let ids: std::collections::BTreeSet<u64> = led.iter().map(id).collect();
        self.sizes.retain(|chunk, _| ids.contains(chunk));
        led.iter()
            .filter(|s| self.sizes.get(&id(s)) != Some(&(s.logical_bytes, s.physical_bytes)))
            .take(MAX_SIZES_PER_COMMAND)
            .copied()
            .collect()
    }

    fn acknowledged(&mut self, sent: &[ChunkSize]) {
        for s in sent {
            self.sizes.insert(ChunkId::new(VolumeId(s.volume), s.chunk).0, (s.logical_bytes, s.physical_bytes));
        }
    }
}

/// The sizes `state` holds from reports, in chunk order.
fn managed_sizes(state: &tundra_cluster::ClusterState) -> Vec<ManagedSize> {
    state
        .chunks()
        .iter()
        .filter_map(|(chunk, c)| {
            let size = c.reported?;
            Some(ManagedSize { chunk: chunk.0, logical_bytes: size.logical_bytes, physical_bytes: size.physical_bytes })
        })
        .collect()
}

fn spaces(u: &NodeUsage) -> (Space, Space) {
    (
        Space::new(u.logical_capacity_bytes, u.physical_capacity_bytes),
        Space::new(u.logical_used_bytes, u.physical_used_bytes),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_snapshot_file_is_replaced_whole_and_absent_means_none() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileSnapshots { path: dir.path().join(SNAPSHOT_FILE) };
        assert_eq!(store.load().unwrap(), None);
        store.save(b"first").unwrap();
        store.save(b"second, longer").unwrap();
        assert_eq!(store.load().unwrap().as_deref(), Some(&b"second, longer"[..]));
        assert!(!dir.path().join("manager.next").exists());
    }

    fn size(chunk: u32, physical_bytes: u64) -> ChunkSize {
        ChunkSize { volume: 3, chunk, pages: 1, logical_bytes: 8192, physical_bytes }
    }

    /// A report carries only what changed since the last acknowledgement, at most
    /// `MAX_SIZES_PER_COMMAND`; an unacknowledged report is sent again, and a chunk no longer
    /// led is forgotten, so that it is sent again if its leadership comes back.
    #[test]
    fn reports_carry_only_changed_sizes_and_are_bounded() {
        let mut reporter = Reporter::default();
        let led: Vec<ChunkSize> = (0..3).map(|c| size(c, 100)).collect();
        assert_eq!(reporter.changed(&led), led);
        // Not acknowledged: the same again.
        assert_eq!(reporter.changed(&led), led);
        reporter.acknowledged(&led);
        assert!(reporter.changed(&led).is_empty());
        let moved = vec![size(0, 100), size(1, 120), size(2, 100)];
        assert_eq!(reporter.changed(&moved), vec![size(1, 120)]);
        reporter.acknowledged(&[size(1, 120)]);
        // Chunk 2 no longer led, then led again: reported again.
        assert!(reporter.changed(&moved[..2]).is_empty());
        assert_eq!(reporter.changed(&moved), vec![size(2, 100)]);
        let many: Vec<ChunkSize> = (0..(MAX_SIZES_PER_COMMAND as u32 + 10)).map(|c| size(c, 7)).collect();
        let first = reporter.changed(&many);
        assert_eq!(first.len(), MAX_SIZES_PER_COMMAND);
        reporter.acknowledged(&first);
        assert_eq!(reporter.changed(&many).len(), 10);
    }
}
