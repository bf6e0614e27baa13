//! Chunk moves back and forth under faults (seed 000 §4.2: the manager moves chunks; the
//! protocol is Raft's membership change). Four nodes; each chunk's group has three voters, on
//! the nodes the simulation's catalog places it ([`Cluster::build_placed`]), and a node starts
//! only the groups the catalog gives it, forgetting what is left of the others. One seed drives
//! everything, as in the three-node simulation: the faults (messages lost, duplicated and
//! delayed, partitions, crashes that lose unflushed writes, pages gone bad), the client checked
//! against the model, and a mover that again and again moves a replica of a chunk from one of
//! its voters to the node outside its voter set, which over a run is nearly always a node that
//! held the chunk before.
//!
//! A move runs the steps of tundra-member's migrate.rs `execute`, interleaved with the client
//! and the faults (each remote step is a task of its own that the main loop looks at once per
//! step, so a crash of the source, the target or the leader can land between or during them):
//! 1. the catalog enters the move, so that the target runs the group (at a restart too);
//! 2. the target starts an empty replica, forgetting first what its log holds of the group
//!    (`Host::forget_group_on`: migrate.rs `start_replica`);
//! 3. the leader adds the target as a learner, and the mover waits, for a bounded time, until
//!    its log matches the leader's (migrate.rs `wait_caught_up`);
//! 4. the leader changes the voters to the old set without the source and with the target;
//! 5. the catalog takes the new set and the source forgets its replica (`Host::drop_group`),
//!    or does so at its next start if it is down.
//!
//! A step that fails or times out hands the move to the settling (migrate.rs `settle`): the
//! group's membership, as a leader that a quorum just confirmed has it, says how the move
//! ends. The target a voter means finished (a joint configuration completed first); otherwise
//! it is rolled back (the learner removed, then the target's replica forgotten). The catalog
//! follows only what committed: a node leaves it once the group's committed membership no
//! longer names it, which is the rule that makes forgetting a replica safe (a forgotten log
//! must hold nothing a quorum counted on: seed 000 §3.2.1, the log is the write-ahead log of
//! the replica's applies).
//!
//! That rule alone is not enough, and this simulation is what showed it. A replica forgotten
//! keeps only its vote; started again on the node (a move back) it is empty, and an empty
//! replica grants its vote to any candidate of a newer term. A voter that was down while the
//! node was removed still has, as its latest configuration, one that counts the node as a
//! voter: its own vote and the empty replica's make a majority of that configuration, and it
//! leads with a log that lacks committed entries, which it then overwrites on the others
//! (seeds 1, 45 and 49 lost acknowledged writes and diverged, openraft's own assertions
//! failing). So a replica forgotten once votes only when its own log names it a voter
//! (`Host::refused_vote`): by then the leader has sent it every entry committed before the
//! change that made it one. [`MoveTwin::VotesUnguarded`] turns that off.
//!
//! That was not enough either. The first snapshot a replica moved back gets can be older than
//! its removal, and name it a voter of the membership it left; on that it campaigned, won with
//! the vote of a voter as far behind as itself, and overwrote entries committed since with the
//! help of entries it held before it was forgotten (seed 50448 of a 1,500-seed run, openraft's
//! assertion failing on the replica that held them). So a forgotten replica's reset records the
//! highest index it held, and until its log reaches it again the replica neither campaigns nor
//! votes (campaign.rs, `Host::short_of_held`); [`MoveTwin::HeldUnguarded`] turns
//! that off. From there it votes as any lagging replica, named a voter by its log or not: with
//! the rule before (vote only while named a voter) kept as well, seed 70292 stalled in a joint
//! configuration whose new half needed the vote of replicas whose logs did not name them yet.
//!
//! Checked as in the three-node simulation: after every step, each store's invariants, every
//! replica's content after each applied index against the others' and every read against the
//! model; at the end, with the faults off and every node up, each group settled on the voters
//! the catalog lists, every voter's replica holding the same pages, every other node holding
//! no page of the chunk and running no replica of it, and every page reading as the model
//! allows.
//!
//! Four twins (injected bugs the checks must catch): [`MoveTwin::ForgetSourceEarly`] forgets
//! the source's replica as soon as the learner caught up, before the voter change (a voter
//! losing its log), [`MoveTwin::ForgetKeepsLog`] turns on `Host::set_forget_keeps_log` on every
//! host (the store's copy forgotten, the log kept: the bug that kept chunks from moving back),
//! [`MoveTwin::VotesUnguarded`] lets forgotten replicas vote from an empty log, and
//! [`MoveTwin::HeldUnguarded`] lets them campaign and vote short of what they held.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tundra_env::Rng;
use tundra_store::ids::{ChunkId, PageNo};

use super::check::{Applied, Model, chunk_digest};
use super::cluster::{self, Cluster, Moving};
use super::net::{NetFaults, SimNet};
use super::{
    CHUNKS, PAGES_PER_CHUNK, Report, Swarm, check_stores, cut_or_heal, final_reads, finish_run, note_leaders, operate,
    replica_content,
};
use crate::host::Host;
use crate::types::NodeId;

/// Nodes of a run: one more than a group's voters, so that every chunk has a node to move to.
pub const MOVE_NODES: u64 = 4;
const VOTERS: usize = 3;
/// How long the mover waits for a learner to be added, and for a voter change.
const ADD_LIMIT: Duration = Duration::from_secs(2);
const CHANGE_LIMIT: Duration = Duration::from_secs(3);
/// How long a membership query waits for the leader to confirm its leadership with a quorum.
const QUERY_LIMIT: Duration = Duration::from_millis(800);

/// What one run with moves is asked to do.
#[derive(Clone, Copy, Debug)]
pub struct MoveOptions {
    pub steps: u32,
    pub trace: bool,
    pub twin: MoveTwin,
}

/// The injected bug of a twin, if any.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MoveTwin {
    #[default]
    None,
    /// The source's replica is forgotten as soon as the learner caught up, before the voter
    /// change committed: a voter loses its log while the group still counts it.
    ForgetSourceEarly,
    /// Every host keeps the log of a replica it forgets (`Host::set_forget_keeps_log`): a
    /// replica started again later meets its old log over an emptied store.
    ForgetKeepsLog,
    /// Every host lets a replica it forgot vote from an empty log (`Host::set_votes_unguarded`):
    /// a voter that missed the node's removal can then be elected with its vote. The hosts
    /// campaign without pre-votes, the setting the bug was found in.
    VotesUnguarded,
    /// Every host lets a replica it forgot campaign, and vote once its log names it a voter,
    /// before its log reaches what it held (`Host::set_held_unguarded`): an old snapshot's
    /// membership can name it a voter of the past. Without pre-votes, as `VotesUnguarded`.
    HeldUnguarded,
}

/// What the moves of one run (or many, added up) did.
#[derive(Clone, Debug, Default)]
pub struct MoveStats {
    /// Moves begun, and of those the ones whose target had run a replica of the chunk before
    /// (as a voter, or as the learner of a move rolled back).
    pub begun: u64,
    pub begun_to_a_former_replica: u64,
    /// Moves finished (the target a voter, the source forgotten), and of those the ones whose
    /// target had been a voter of the chunk before: moves back.
    pub finished: u64,
    pub moves_back: u64,
    /// Moves finished by the settling after a step failed (the voter change had committed
    /// unseen, or a joint configuration was completed), and the joint configurations it asked
    /// the leader to complete.
    pub finished_by_settling: u64,
    pub joints_completed: u64,
    /// Moves rolled back (the learner removed or never added, the target forgotten), and the
    /// removals of a learner the settling asked for.
    pub rolled_back: u64,
    pub learners_removed: u64,
    /// Steps that failed and handed the move to the settling.
    pub catch_ups_failed: u64,
    pub voter_changes_failed: u64,
    /// Membership queries of the settling that got no answer (asked again next step).
    pub queries_unanswered: u64,
    /// Crashes while a move was under way, and of which node.
    pub crashes_mid_move: u64,
    pub sources_crashed: u64,
    pub targets_crashed: u64,
    pub leaders_crashed: u64,
    /// Replicas forgotten: sources dropped, targets dropped, and what a node's start forgot
    /// (the chunk left it while it was down).
    pub sources_forgotten: u64,
    pub targets_forgotten: u64,
    pub forgotten_at_start: u64,
    /// End checks: voters compared, and nodes checked to hold nothing of a chunk.
    pub voter_comparisons: u64,
    pub forgotten_checks: u64,
}

impl MoveStats {
    pub fn add(&mut self, o: &MoveStats) {
        self.begun += o.begun;
        self.begun_to_a_former_replica += o.begun_to_a_former_replica;
        self.finished += o.finished;
        self.moves_back += o.moves_back;
        self.finished_by_settling += o.finished_by_settling;
        self.joints_completed += o.joints_completed;
        self.rolled_back += o.rolled_back;
        self.learners_removed += o.learners_removed;
        self.catch_ups_failed += o.catch_ups_failed;
        self.voter_changes_failed += o.voter_changes_failed;
        self.queries_unanswered += o.queries_unanswered;
        self.crashes_mid_move += o.crashes_mid_move;
        self.sources_crashed += o.sources_crashed;
        self.targets_crashed += o.targets_crashed;
        self.leaders_crashed += o.leaders_crashed;
        self.sources_forgotten += o.sources_forgotten;
        self.targets_forgotten += o.targets_forgotten;
        self.forgotten_at_start += o.forgotten_at_start;
        self.voter_comparisons += o.voter_comparisons;
        self.forgotten_checks += o.forgotten_checks;
    }
}

/// The move faults and pace one seed turns on, drawn apart from the run's other random
/// numbers.
#[derive(Clone, Copy, Debug)]
struct MoveSwarm {
    /// Chance per step that an idle mover begins a move.
    begin: f64,
    /// Chance per step, while a move is under way and every node is up, that its source, its
    /// target or the group's leader crashes.
    crash_mid_move: f64,
    /// How long a learner may take to catch up before the move is settled (rolled back).
    catch_up_limit: Duration,
}

impl MoveSwarm {
    fn draw(seed: u64) -> MoveSwarm {
        let mut rng = Rng::new(seed ^ 0x6d6f_7665);
        MoveSwarm {
            begin: *rng.pick(&[0.15, 0.3, 0.6]),
            crash_mid_move: *rng.pick(&[0.0, 0.04, 0.1, 0.2]),
            catch_up_limit: Duration::from_millis(*rng.pick(&[400, 1_500, 4_000])),
        }
    }
}

/// A group's membership as a leader a quorum just confirmed has it (migrate.rs's confirmed
/// query): `joint` while a change between two voter sets is under way, when `voters` is the
/// union of both.
#[derive(Clone, Debug)]
struct Members {
    voters: BTreeSet<NodeId>,
    learners: BTreeSet<NodeId>,
    joint: bool,
}

/// Where the move under way stands. Each phase but `Idle` has the task of its remote step.
enum Phase {
    Idle,
    /// The learner being added and caught up.
    Adding(Moving, JoinHandle<Result<(), String>>),
    /// The voters being changed.
    Changing(Moving, JoinHandle<Result<(), String>>),
    /// The group's membership being asked.
    Settling(Moving, JoinHandle<Option<Members>>),
    /// A change the settling asked for (a joint configuration completed, a learner removed);
    /// the settling asks again once it is over.
    Completing(Moving, JoinHandle<Result<(), String>>),
}

/// The mover: one move at a time, as the real cluster's claim on moves allows.
struct Mover {
    rng: Rng,
    swarm: MoveSwarm,
    twin: MoveTwin,
    phase: Phase,
    /// Per chunk, the nodes that were ever a voter of it, and those that ever ran a replica.
    voted: BTreeMap<ChunkId, BTreeSet<NodeId>>,
    ran: BTreeMap<ChunkId, BTreeSet<NodeId>>,
    /// No new move begins (the run converges).
    stopped: bool,
}

impl Mover {
    fn new(rng: Rng, swarm: MoveSwarm, twin: MoveTwin, cluster: &Cluster) -> Mover {
        let voted: BTreeMap<ChunkId, BTreeSet<NodeId>> =
            catalog(cluster).iter().map(|(&chunk, p)| (chunk, p.replicas.clone())).collect();
        Mover { rng, swarm, twin, phase: Phase::Idle, ran: voted.clone(), voted, stopped: false }
    }

    /// The move under way: begun (the catalog lists it) and not yet finished or rolled back.
    fn under_way(&self) -> Option<Moving> {
        match &self.phase {
            Phase::Idle => None,
            Phase::Adding(m, _) | Phase::Changing(m, _) | Phase::Settling(m, _) | Phase::Completing(m, _) => Some(*m),
        }
    }

    /// One look at the move: a finished step's outcome taken and the next step begun, or a
    /// new move begun.
    async fn poll(&mut self, cluster: &mut Cluster, report: &mut Report) {
        let phase = std::mem::replace(&mut self.phase, Phase::Idle);
        self.phase = match phase {
            Phase::Idle if !self.stopped && self.rng.chance(self.swarm.begin) => {
                let m = self.draw(cluster);
                self.begin(cluster, m, report).await
            }
            Phase::Adding(m, task) if task.is_finished() => match task.await.expect("the learner's task") {
                Ok(()) => {
                    if self.twin == MoveTwin::ForgetSourceEarly {
                        forget(cluster, m.from, m.chunk, report, "source (too early: the twin)").await;
                    }
                    change_voters(cluster, m)
                }
                Err(why) => {
                    cluster.net.note(|| format!("move g{} {}->{}: catch-up failed: {why}", m.chunk.0, m.from, m.to));
                    report.moves.catch_ups_failed += 1;
                    settle(cluster, m)
                }
            },
            Phase::Changing(m, task) if task.is_finished() => match task.await.expect("the voters' task") {
                Ok(()) => {
                    let voters = new_voters(cluster, m);
                    self.finish(cluster, m, voters, report).await;
                    Phase::Idle
                }
                Err(why) => {
                    cluster
                        .net
                        .note(|| format!("move g{} {}->{}: voter change failed: {why}", m.chunk.0, m.from, m.to));
                    report.moves.voter_changes_failed += 1;
                    settle(cluster, m)
                }
            },
            Phase::Settling(m, task) if task.is_finished() => match task.await.expect("the query's task") {
                Some(members) => self.decide(cluster, m, members, report).await,
                None => {
                    report.moves.queries_unanswered += 1;
                    settle(cluster, m)
                }
            },
            Phase::Completing(m, task) if task.is_finished() => {
                let done = task.await.expect("the settling's task");
                cluster.net.note(|| format!("move g{} {}->{}: settling change: {done:?}", m.chunk.0, m.from, m.to));
                settle(cluster, m)
            }
            other => other,
        };
    }

    /// Draws a move of a chunk, from one of its voters to the node outside them.
    fn draw(&mut self, cluster: &Cluster) -> Moving {
        let chunk = *self.rng.pick(&cluster.chunks);
        let replicas: Vec<NodeId> = catalog(cluster)[&chunk].replicas.iter().copied().collect();
        let from = *self.rng.pick(&replicas);
        let to = (1..=MOVE_NODES).find(|n| !replicas.contains(n)).expect("a node outside the voters");
        Moving { chunk, from, to }
    }

    /// Begins move `m`: the catalog enters it, the target starts an empty replica (if it is
    /// up; else at its restart), and the leader is asked to add it as a learner.
    async fn begin(&mut self, cluster: &mut Cluster, m: Moving, report: &mut Report) -> Phase {
        let Moving { chunk, from, to } = m;
        let replicas: Vec<NodeId> = catalog(cluster)[&chunk].replicas.iter().copied().collect();
        catalog_mut(cluster).get_mut(&chunk).expect("in the catalog").moving = Some(m);
        report.moves.begun += 1;
        let ran = self.ran.entry(chunk).or_default();
        report.moves.begun_to_a_former_replica += u64::from(ran.contains(&to));
        ran.insert(to);
        cluster.net.note(|| format!("move g{} {from}->{to} begins (voters {replicas:?})", chunk.0));
        if let Some(host) = cluster.nodes[index(to)].host.clone()
            && host.raft(chunk).is_err()
        {
            // migrate.rs `start_replica`: what the target's log holds of the group is forgotten
            // first. The group's committed membership does not name the target, so nothing a
            // quorum decided depends on that log; a voter that missed the target's removal may
            // still count it, which is why the replica votes only once its log names it a voter.
            if host.has_log_of(chunk)
                && let Err(why) = cluster::forget_replica(&host, chunk, false).await
            {
                report.violations.push(format!("node {to}: forgetting chunk {}: {why}", chunk.0));
            }
            if let Err(why) = host.add_group(chunk).await {
                report.violations.push(format!("node {to}: starting a replica of chunk {}: {why}", chunk.0));
            }
        }
        let limit = self.swarm.catch_up_limit;
        match cluster.leader(chunk) {
            Some(leader) => Phase::Adding(m, tokio::spawn(add_and_catch_up(leader, m, limit))),
            None => Phase::Adding(m, tokio::spawn(async { Err("no leader".to_string()) })),
        }
    }

    /// The settling's decision from the group's confirmed membership (migrate.rs `settle`).
    async fn decide(&mut self, cluster: &mut Cluster, m: Moving, members: Members, report: &mut Report) -> Phase {
        cluster.net.note(|| format!("move g{} {}->{}: settling on {members:?}", m.chunk.0, m.from, m.to));
        if members.voters.contains(&m.to) {
            if members.joint || members.voters.contains(&m.from) {
                // A joint configuration a failed change left: complete it.
                report.moves.joints_completed += 1;
                let target: BTreeSet<NodeId> = members.voters.iter().copied().filter(|&n| n != m.from).collect();
                return match cluster.leader(m.chunk) {
                    Some(leader) => Phase::Completing(m, tokio::spawn(voters_task(leader, m.chunk, target))),
                    None => settle(cluster, m),
                };
            }
            report.moves.finished_by_settling += 1;
            self.finish(cluster, m, members.voters, report).await;
            return Phase::Idle;
        }
        if members.learners.contains(&m.to) {
            report.moves.learners_removed += 1;
            return match cluster.leader(m.chunk) {
                Some(leader) => Phase::Completing(m, tokio::spawn(remove_learner_task(leader, m.chunk, m.to))),
                None => settle(cluster, m),
            };
        }
        // Rolled back: the group never made the target a voter, and lists it no more.
        let listed = catalog(cluster)[&m.chunk].replicas.clone();
        if members.voters != listed {
            report.violations.push(format!(
                "chunk {}: a move rolled back leaves voters {:?}, the catalog lists {listed:?}",
                m.chunk.0, members.voters
            ));
        }
        catalog_mut(cluster).get_mut(&m.chunk).expect("in the catalog").moving = None;
        report.moves.rolled_back += 1;
        cluster.net.note(|| format!("move g{} {}->{} rolled back", m.chunk.0, m.from, m.to));
        if forget(cluster, m.to, m.chunk, report, "target").await {
            report.moves.targets_forgotten += 1;
        }
        Phase::Idle
    }

    /// The voter change committed: the catalog takes the new voters, and the source forgets its
    /// replica now, or at its next start if it is down.
    async fn finish(&mut self, cluster: &mut Cluster, m: Moving, voters: BTreeSet<NodeId>, report: &mut Report) {
        let expected = new_voters(cluster, m);
        if voters != expected {
            report.violations.push(format!(
                "chunk {}: the move {}->{} finished on voters {voters:?}, not {expected:?}",
                m.chunk.0, m.from, m.to
            ));
        }
        let placement = catalog_mut(cluster).get_mut(&m.chunk).expect("in the catalog");
        placement.replicas = voters;
        placement.moving = None;
        report.moves.finished += 1;
        let voted = self.voted.entry(m.chunk).or_default();
        report.moves.moves_back += u64::from(voted.contains(&m.to));
        voted.insert(m.to);
        cluster.net.note(|| format!("move g{} {}->{} finished", m.chunk.0, m.from, m.to));
        if forget(cluster, m.from, m.chunk, report, "source").await {
            report.moves.sources_forgotten += 1;
        }
    }
}

/// Forgets `node`'s replica of `chunk` if the node is up (`Host::drop_group`); a node that is
/// down forgets it at its start. Answers whether it was forgotten now.
async fn forget(cluster: &mut Cluster, node: NodeId, chunk: ChunkId, report: &mut Report, role: &str) -> bool {
    let Some(host) = cluster.nodes[index(node)].host.clone() else { return false };
    cluster.net.note(|| format!("node {node} forgets its replica of g{} ({role})", chunk.0));
    match cluster::forget_replica(&host, chunk, true).await {
        Ok(()) => true,
        Err(why) => {
            report.violations.push(format!("node {node}: forgetting its replica of chunk {} failed: {why}", chunk.0));
            false
        }
    }
}

/// The voters a move ends with: the catalog's without the source, with the target.
fn new_voters(cluster: &Cluster, m: Moving) -> BTreeSet<NodeId> {
    let replicas = &catalog(cluster)[&m.chunk].replicas;
    replicas.iter().copied().filter(|&n| n != m.from).chain([m.to]).collect()
}

fn change_voters(cluster: &Cluster, m: Moving) -> Phase {
    let voters = new_voters(cluster, m);
    match cluster.leader(m.chunk) {
        Some(leader) => Phase::Changing(m, tokio::spawn(voters_task(leader, m.chunk, voters))),
        None => Phase::Changing(m, tokio::spawn(async { Err("no leader".to_string()) })),
    }
}

/// Asks the group's membership of the leader with the highest term (a task; `None` when there
/// is none, and then the next step asks again).
fn settle(cluster: &Cluster, m: Moving) -> Phase {
    let leader = cluster.leader(m.chunk);
    Phase::Settling(m, tokio::spawn(async move { confirmed_members(leader?, m.chunk).await }))
}

/// migrate.rs `begin_on_target`'s step 4 at the leader: the learner added, then its log
/// matched up to the leader's last entry as it was then, within `limit` (`wait_caught_up`).
async fn add_and_catch_up(leader: Arc<Host>, m: Moving, limit: Duration) -> Result<(), String> {
    match tokio::time::timeout(ADD_LIMIT, leader.add_learner(m.chunk, m.to)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err(format!("adding the learner took over {ADD_LIMIT:?}")),
    }
    let (_, goal) = leader.replication_of(m.chunk, m.to).map_err(|e| e.to_string())?;
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        // A leader that crashed keeps its last metrics, which would say it leads: its stopped
        // group is what tells (as a coordinator would find the node gone).
        let raft = leader.raft(m.chunk).map_err(|e| e.to_string())?;
        if let Err(fatal) = &raft.metrics().borrow().running_state {
            return Err(format!("the leader's group stopped: {fatal}"));
        }
        let (matched, _) = leader.replication_of(m.chunk, m.to).map_err(|e| e.to_string())?;
        if matched >= goal {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("node {} matched {matched:?} of {goal:?} within {limit:?}", m.to));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn voters_task(leader: Arc<Host>, chunk: ChunkId, voters: BTreeSet<NodeId>) -> Result<(), String> {
    match tokio::time::timeout(CHANGE_LIMIT, leader.change_voters(chunk, voters)).await {
        Ok(done) => done.map_err(|e| e.to_string()),
        Err(_) => Err(format!("the voter change took over {CHANGE_LIMIT:?}")),
    }
}

async fn remove_learner_task(leader: Arc<Host>, chunk: ChunkId, node: NodeId) -> Result<(), String> {
    match tokio::time::timeout(CHANGE_LIMIT, leader.remove_learner(chunk, node)).await {
        Ok(done) => done.map_err(|e| e.to_string()),
        Err(_) => Err(format!("removing the learner took over {CHANGE_LIMIT:?}")),
    }
}

/// The group's membership at `leader`, once a quorum confirmed its leadership and it applied
/// everything committed before (migrate.rs's `ConfirmedQuery`): then no newer leader exists
/// whose log holds a membership this one lacks, and a membership it has applied is committed.
/// A joint configuration is answered even if not committed yet (the settling completes it); a
/// uniform one not applied yet is no answer.
async fn confirmed_members(leader: Arc<Host>, chunk: ChunkId) -> Option<Members> {
    tokio::time::timeout(QUERY_LIMIT, leader.linearize(chunk)).await.ok()?.ok()?;
    let metrics = leader.raft(chunk).ok()?.metrics().borrow().clone();
    let joint = metrics.membership_config.membership().get_joint_config().len() > 1;
    if !joint && leader.membership_unsettled(chunk).ok()?.is_some() {
        return None;
    }
    let (voters, learners) = leader.members(chunk).ok()?;
    Some(Members { voters, learners, joint })
}

fn index(node: NodeId) -> usize {
    (node - 1) as usize
}

fn catalog(cluster: &Cluster) -> &BTreeMap<ChunkId, cluster::Placement> {
    cluster.catalog.as_ref().expect("a cluster with moves has a catalog")
}

fn catalog_mut(cluster: &mut Cluster) -> &mut BTreeMap<ChunkId, cluster::Placement> {
    cluster.catalog.as_mut().expect("a cluster with moves has a catalog")
}

/// Runs one seed with moves on a fresh current-thread runtime with a paused clock.
pub fn run_moves(seed: u64, options: MoveOptions) -> Report {
    crate::runtime::seed_thread_rng(seed ^ 0x6d6f_7665_5eed);
    cluster::watch_panics();
    cluster::take_panics();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    let mut report = runtime.block_on(simulate(seed, options));
    drop(runtime);
    report.violations.extend(cluster::take_panics().into_iter().map(|p| format!("a task panicked: {p}")));
    report
}

async fn simulate(seed: u64, options: MoveOptions) -> Report {
    let mut rng = Rng::new(seed);
    let swarm = Swarm::draw(&mut rng, seed);
    let move_swarm = MoveSwarm::draw(seed);
    let net = SimNet::new(rng.fork(), swarm.net, options.trace);
    net.note(|| format!("seed {seed} swarm {swarm:?} moves {move_swarm:?} twin {:?}", options.twin));
    let applied = Arc::new(Mutex::new(Applied::default()));
    // Each chunk's three voters: every node but one the seed draws.
    let placements: Vec<BTreeSet<NodeId>> = (0..CHUNKS)
        .map(|_| {
            let outside = rng.range(1..MOVE_NODES + 1);
            (1..=MOVE_NODES).filter(|&n| n != outside).collect()
        })
        .collect();
    debug_assert!(placements.iter().all(|p| p.len() == VOTERS));
    let host_bug = match options.twin {
        MoveTwin::ForgetKeepsLog => cluster::HostBug::ForgetKeepsLog,
        MoveTwin::VotesUnguarded => cluster::HostBug::VotesUnguarded,
        MoveTwin::HeldUnguarded => cluster::HostBug::HeldUnguarded,
        MoveTwin::None | MoveTwin::ForgetSourceEarly => cluster::HostBug::None,
    };
    let mut cluster =
        Cluster::build_placed(&mut rng, net.clone(), MOVE_NODES, &placements, applied.clone(), host_bug).await;
    for node in &cluster.nodes {
        node.log.set_stalls(Rng::new(seed ^ 0x5374_616c ^ node.id), swarm.stalls);
    }
    let mut mover = Mover::new(rng.fork(), move_swarm, options.twin, &cluster);
    let mut report = Report { seeds: 1, ..Report::default() };
    let mut model = Model::default();
    let mut sequence = 0u64;
    for step in 0..options.steps {
        report.steps += 1;
        inject_faults(&mut cluster, &mut rng, &swarm, &move_swarm, &mover, &mut report).await;
        mover.poll(&mut cluster, &mut report).await;
        operate(&cluster, &mut rng, &swarm, &mut model, &mut sequence, &mut report).await;
        tokio::time::sleep(Duration::from_millis(rng.range(1..60))).await;
        check_stores(&cluster, &mut report);
        note_leaders(&cluster, step);
        for panic in cluster::take_panics() {
            cluster.net.note(|| format!("a task panicked: {panic}"));
            report.violations.push(format!("a task panicked: {panic}"));
        }
    }
    converge(&mut cluster, &mut mover, &mut model, &mut report).await;
    finish_run(cluster, &net, &applied, &mut report).await;
    report
}

/// The three-node simulation's faults on four nodes (at most one node down and one cut off at
/// a time), and, while a move is under way, crashes aimed at it: its source, its target or its
/// group's leader.
async fn inject_faults(
    cluster: &mut Cluster,
    rng: &mut Rng,
    swarm: &Swarm,
    move_swarm: &MoveSwarm,
    mover: &Mover,
    report: &mut Report,
) {
    let down: Vec<usize> = (0..cluster.nodes.len()).filter(|&i| !cluster.is_up(i)).collect();
    let moving = mover.under_way();
    if let Some(&i) = down.first() {
        if rng.chance(0.3) {
            cluster.net.note(|| format!("restart node {}", i + 1));
            match cluster.start(i).await {
                Ok(()) => report.restarts += 1,
                Err(e) => report.violations.push(format!("node {} failed to restart: {e}", i + 1)),
            }
        }
    } else if let Some(m) = moving.filter(|_| rng.chance(move_swarm.crash_mid_move)) {
        let leader = cluster.leader(m.chunk).map(|h| h.id());
        let (role, node) = match rng.below(3) {
            0 => ("source", m.from),
            1 => ("target", m.to),
            _ => ("leader", leader.unwrap_or(m.from)),
        };
        let lost = cluster.crash(index(node), rng).await;
        cluster.net.note(|| format!("crash node {node} ({role} of a move) losing {lost} log records"));
        report.crashes += 1;
        report.log_records_lost_in_crashes += lost as u64;
        report.moves.crashes_mid_move += 1;
        report.moves.sources_crashed += u64::from(node == m.from);
        report.moves.targets_crashed += u64::from(node == m.to);
        report.moves.leaders_crashed += u64::from(Some(node) == leader);
    } else if rng.chance(swarm.crash) {
        let i = rng.below(cluster.nodes.len() as u64) as usize;
        let lost = cluster.crash(i, rng).await;
        cluster.net.note(|| format!("crash node {} losing {lost} log records", i + 1));
        report.crashes += 1;
        report.log_records_lost_in_crashes += lost as u64;
        if let Some(m) = moving {
            let node = i as u64 + 1;
            report.moves.crashes_mid_move += 1;
            report.moves.sources_crashed += u64::from(node == m.from);
            report.moves.targets_crashed += u64::from(node == m.to);
        }
    }
    cut_or_heal(cluster, rng, swarm, report);
    if rng.chance(swarm.corrupt) {
        corrupt_one_replica(cluster, rng, report);
    }
}

/// Makes a page's stored bytes bad on one voter of a chunk no move touches, if the chunk's
/// other voters hold it good as far as the simulation knows (one bad copy at a time, so that a
/// good one is always left to repair from, or to send a learner), and no node is down.
fn corrupt_one_replica(cluster: &mut Cluster, rng: &mut Rng, report: &mut Report) {
    let i = rng.below(cluster.nodes.len() as u64) as usize;
    let chunk = *rng.pick(&cluster.chunks);
    let page = PageNo(rng.below(PAGES_PER_CHUNK) as u32);
    if (0..cluster.nodes.len()).any(|j| !cluster.is_up(j)) {
        return;
    }
    let placement = &catalog(cluster)[&chunk];
    let node = i as u64 + 1;
    if placement.moving.is_some() || !placement.replicas.contains(&node) {
        return;
    }
    let others_good = placement.replicas.iter().filter(|&&n| n != node).all(|&n| {
        let host = cluster.nodes[index(n)].host.as_ref().expect("every node is up");
        cluster::sound(host, chunk, page)
    });
    if !others_good {
        return;
    }
    if let Some(entry) = cluster.corrupt(i, chunk, page, rng) {
        cluster.net.note(|| format!("corrupt node {node} g{} page {} lsn {}", chunk.0, page.0, entry.lsn.0));
        report.pages_corrupted += 1;
    }
}

/// The faults stop and every node runs; the move under way is settled; within a bound of
/// simulated time every group must have a leader whose settled membership is the catalog's
/// voters and whose log every voter applied; the voters must hold the same pages, every other
/// node none of the chunk; and every page must read as the model allows.
async fn converge(cluster: &mut Cluster, mover: &mut Mover, model: &mut Model, report: &mut Report) {
    cluster.net.heal();
    cluster.net.set_faults(NetFaults { loss: 0.0, duplicate: 0.0, delay_max_ms: 1 });
    for i in 0..cluster.nodes.len() {
        if !cluster.is_up(i) {
            if let Err(e) = cluster.start(i).await {
                report.violations.push(format!("node {} failed to restart: {e}", i + 1));
                return;
            }
            report.restarts += 1;
        }
    }
    mover.stopped = true;
    for _ in 0..600 {
        if mover.under_way().is_none() {
            break;
        }
        mover.poll(cluster, report).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if let Some(m) = mover.under_way() {
        report.violations.push(format!(
            "the move of chunk {} from node {} to node {} was not settled within 60 simulated seconds",
            m.chunk.0, m.from, m.to
        ));
        return;
    }
    let mut converged = Vec::new();
    for &chunk in &cluster.chunks.clone() {
        match voters_settled(cluster, chunk).await {
            Ok(()) => converged.push(chunk),
            Err(why) => report.violations.push(format!("chunk {}: {why}", chunk.0)),
        }
    }
    for host in cluster.nodes.iter().filter_map(|n| n.host.clone()) {
        host.scrub_pass(Duration::ZERO).await;
    }
    for chunk in converged {
        let replicas = catalog(cluster)[&chunk].replicas.clone();
        let mut first: Option<(NodeId, Vec<String>)> = None;
        let mut digests = Vec::new();
        for host in cluster.nodes.iter().filter_map(|n| n.host.clone()) {
            if !replicas.contains(&host.id()) {
                // Forgotten: no replica runs, and the store holds no page of the chunk.
                report.moves.forgotten_checks += 1;
                if host.raft(chunk).is_ok() {
                    report.violations.push(format!(
                        "chunk {}: node {} runs a replica it does not hold",
                        chunk.0,
                        host.id()
                    ));
                }
                let left = host.store().chunk_entries(chunk).len();
                if left > 0 {
                    report.violations.push(format!(
                        "chunk {}: node {}, not a voter, still holds {left} of its pages",
                        chunk.0,
                        host.id()
                    ));
                }
                continue;
            }
            let content = replica_content(&host, chunk);
            digests.push(format!("n{}:{:08x}", host.id(), chunk_digest(host.store(), chunk)));
            match &first {
                None => first = Some((host.id(), content)),
                Some((node, expected)) => {
                    report.replica_comparisons += 1;
                    report.moves.voter_comparisons += 1;
                    if content != *expected {
                        report.violations.push(format!(
                            "chunk {}: voter node {} differs from voter node {node}",
                            chunk.0,
                            host.id()
                        ));
                    }
                }
            }
        }
        cluster.net.note(|| format!("final g{} on {replicas:?} digests {}", chunk.0, digests.join(" ")));
    }
    final_reads(cluster, model, report).await;
}

/// Waits until a leader of `chunk` has a settled membership of voters only, and every voter
/// runs a replica that applied the leader's whole log; the voters must be the catalog's.
async fn voters_settled(cluster: &Cluster, chunk: ChunkId) -> Result<(), String> {
    let mut last = String::from("no leader");
    for _ in 0..600 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Some(leader) = cluster.leader(chunk) else { continue };
        let Ok(raft) = leader.raft(chunk) else { continue };
        match leader.membership_unsettled(chunk) {
            Ok(None) => {}
            Ok(Some(why)) => {
                last = why;
                continue;
            }
            Err(e) => {
                last = e.to_string();
                continue;
            }
        }
        let Ok((voters, learners)) = leader.members(chunk) else { continue };
        if !learners.is_empty() {
            last = format!("learners {learners:?} left in the group");
            continue;
        }
        let end = raft.metrics().borrow().last_log_index;
        let all = voters.iter().all(|&v| {
            cluster.nodes[index(v)].host.as_ref().is_some_and(|host| {
                host.raft(chunk).is_ok_and(|r| r.metrics().borrow().last_applied.map(|id| id.index) == end)
            })
        });
        if !all {
            last = format!("voters {voters:?} have not all applied up to {end:?}");
            continue;
        }
        let listed = &catalog(cluster)[&chunk].replicas;
        if voters != *listed {
            return Err(format!("the group's voters are {voters:?}, the catalog lists {listed:?}"));
        }
        return Ok(());
    }
    Err(format!("did not converge within 60 simulated seconds: {last}"))
}
