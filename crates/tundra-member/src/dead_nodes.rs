//! A dead node's replicas repaired without an operator (issue 15, "dead nodes"; seed 000 §4.2:
//! the manager moves chunks between nodes, and a dead node's chunks are moved off it as a
//! drain's are), and a node that comes back learning what it missed.
//!
//! **Repair.** With `[cluster] repair_after` (10 minutes by default, as storage systems wait
//! before they count a silent node out; never under the 5 s after which a report is stale;
//! "off" never), the manager's leader looks once a second for nodes whose last report (the
//! manager's state, `reported_unix_ms`) is older than that, counted from the later of the
//! report and the time it saw itself lead in this term (as manager_members.rs counts a silent
//! member's silence, so that a leader just elected waits a whole period of its own). For the
//! lowest such node that still holds replicas in the leader's catalog it takes the claim on
//! moves (that of a drain of the node: the repair is the drain the leader runs itself, so an
//! operator's `tundra cluster drain` of the same node shares its turn), then makes at most
//! [`MOVES_PER_ROUND`] moves, one at a time, each paced by `move_bytes_per_sec` as any move:
//! first the node's redo replicas, then its chunk replicas, each by migrate.rs's moves, which
//! work with the source dead (the group's leader is on a surviving replica, the learner
//! catches up from it, the voter change leaves the dead node out; migrate.rs's `tell_nodes`
//! says which catalogs must enter the move). It gives the claim back after each round, so
//! other movers get their turn. Before each move it looks again: a node that reports again is
//! not repaired further (what was moved stays moved; the node drops the replicas it lost when
//! it catches its catalog up).
//!
//! It never moves a replica when the group's up replicas (the leader's own node and those
//! whose reports are fresh) are not a majority of its replicas (the group could not commit the
//! change, and a move would only add load to a group already in danger), nor when no up active
//! node can take it (every one holds a replica already, or would pass the fullness limit): the
//! leader says why in `tundra cluster status` (`manager.repair.blocked`), and waits
//! [`IDLE_ROUNDS`] rounds before it tries again (unless the dead nodes change), so that the
//! claim on moves is not taken every second for nothing. A redo group that has
//! more than three replicas and no up node to move one to loses the dead node's replica
//! instead, as a drain does.
//!
//! **Catalog catch-up.** First, a node adopts the replicated volumes created while it was
//! down from its peers' catalogs (adopt.rs). Then every node, a few seconds after it starts and then every
//! [`CATCH_UP_EVERY`], asks each group of each catalogued volume (every chunk's and the redo
//! group) for its membership: the group's own Raft membership is the truth, answered only by a
//! leader a quorum just confirmed (`MembershipChange::ConfirmedQuery`, so a deposed leader's
//! old view is never taken). A group whose membership differs from the catalog's replica set
//! is entered as it is, durably; a replica this node runs of a group that no longer lists it
//! is stopped and its chunk's pages freed (migrate.rs's `drop_replica`, `drop_redo`). Groups
//! with a move under way (a learner in the group, or a move in this node's catalog, which
//! migrate.rs's `settle` ends) are left to the move, and a group whose leader's membership is
//! joint or not applied yet answers no membership at all (`Host::membership_unsettled`): the
//! union of a joint configuration's two voter sets is no replica set to enter.
//!
//! A returning stale replica cannot disturb the groups meanwhile: its log lacks the membership
//! entries that removed it, which every voter of the new set holds, and openraft 0.9
//! (`Engine::handle_vote_req`) refuses a vote request whose last log id is behind its own
//! before it looks at the request's term, so its elections raise no one's term and depose no
//! leader; nobody replicates to it, since no membership lists it (the same argument as for a
//! returning manager member, manager_members.rs). One replica's log may hold less than its
//! voters' and still be asked: one forgotten on a node a chunk moved back to, which starts
//! empty. It refuses every vote until its own log names it a voter (tundra-raft's
//! `Host::refused_vote`), so its empty log elects no stale replica either.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tundra_cluster::mover::{REPORT_STALE_AFTER_MS, report_stale};
use tundra_cluster::{ClusterState, Command, Move, MoveReason, NodeId, NodeStatus};
use tundra_node::ClusterConfig;
use tundra_raft::manager_machine::manager_group;
use tundra_store::ids::{ChunkId, VolumeId};

use crate::background::MOVES_PER_ROUND;
use crate::cluster::{ClusterNode, chunk_spans};
use crate::manager::{ManagerCall, ManagerReply, MoveOwner, now_unix_ms};
use crate::messages::{Forward, MembershipChange, Refusal, VolumeDef};

/// `[cluster] repair_after` when absent: Ceph's `mon_osd_down_out_interval` is 600 s too.
pub const REPAIR_AFTER_DEFAULT: Duration = Duration::from_secs(600);
/// The shortest `repair_after`: a node whose report is not even stale yet is up.
pub const REPAIR_AFTER_MIN: Duration = Duration::from_millis(REPORT_STALE_AFTER_MS);
/// How often the manager's leader looks for dead nodes.
const REPAIR_EVERY: Duration = Duration::from_secs(1);
/// Rounds skipped after a round that could move nothing.
const IDLE_ROUNDS: u32 = 10;
/// How long a node waits after its start before its first catalog catch-up (its peers
/// connect, and the moves its catalog lists are settled first).
const CATCH_UP_FIRST: Duration = Duration::from_secs(3);
/// How often a node catches its catalog up once a pass found every group answering.
pub const CATCH_UP_EVERY: Duration = Duration::from_secs(30);
/// How often it tries again while some group did not answer.
const CATCH_UP_RETRY: Duration = Duration::from_secs(2);
/// How long a catch-up waits for one group's membership.
const QUERY_WAIT: Duration = Duration::from_secs(3);

/// A test-only hook: `TUNDRA_TEST_CATCH_UP=off` keeps a node from catching its catalog up
/// (the twin of the returning node's check: its stale replicas keep running). Unset in
/// production.
fn catch_up_off_for_test() -> bool {
    std::env::var("TUNDRA_TEST_CATCH_UP").is_ok_and(|v| v == "off")
}

/// A test-only hook: `TUNDRA_TEST_REPAIR_RETURNED=1` makes the leader go on repairing a node
/// that reports again (the twin of the test of a node returning mid-repair). Unset in
/// production.
fn repair_returned_for_test() -> bool {
    std::env::var("TUNDRA_TEST_REPAIR_RETURNED").is_ok_and(|v| v == "1")
}

/// `[cluster] repair_after`, checked at start: None when "off".
pub fn repair_after_from_config(config: &ClusterConfig) -> Result<Option<Duration>, String> {
    match config.repair_after.as_deref() {
        None => Ok(Some(REPAIR_AFTER_DEFAULT)),
        Some(text) => crate::rebalance::parse_period_at_least(text, REPAIR_AFTER_MIN, "the repair")
            .map_err(|why| format!("[cluster] repair_after = {text:?}: {why}")),
    }
}

/// One replica moved off a dead node, as status shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepairRecord {
    /// The dead node.
    pub node: u64,
    /// What moved where, in words.
    pub moved: String,
    pub at_unix_ms: u64,
}

/// The repair as `tundra cluster status --json` shows it (`manager.repair`), from the leader
/// that answered.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepairStatus {
    /// `repair_after` in milliseconds; null when off.
    pub after_ms: Option<u64>,
    /// The dead nodes that still hold replicas, lowest first (the first one is repaired).
    pub repairing: Vec<u64>,
    /// Why replicas of a dead node stay where they are (no majority up, no node to take one,
    /// the claim on moves held by another mover), from the last round.
    pub blocked: Vec<String>,
    /// Replicas this leader moved off dead nodes since it started.
    pub moves_total: u64,
    pub failures_total: u64,
    pub last_repair: Option<RepairRecord>,
}

/// What a node keeps about repairs between rounds.
#[derive(Default)]
pub(crate) struct RepairWork {
    /// The term in which this node last saw itself lead the manager, and since when (Unix ms).
    leading_since: parking_lot::Mutex<Option<(u64, u64)>>,
    pub(crate) status: parking_lot::Mutex<RepairStatus>,
    /// Rounds left to skip after one that could move nothing (the claim on moves is not taken
    /// every second for nothing), and the dead nodes it saw: a change of them ends the wait.
    idle: parking_lot::Mutex<(u32, Vec<u64>)>,
}

/// What one repair step did.
enum Step {
    Moved(String),
    /// Nothing more can move now.
    Nothing,
}

impl ClusterNode {
    /// Starts the manager leader's repair rounds (when `repair_after` is set) and this node's
    /// catalog catch-up.
    pub(crate) fn start_dead_node_work(self: &Arc<ClusterNode>) {
        self.repair.status.lock().after_ms = self.repair_after.map(|after| after.as_millis() as u64);
        let weak = Arc::downgrade(self);
        if self.repair_after.is_some() {
            let weak = weak.clone();
            self.spawn(async move {
                loop {
                    tokio::time::sleep(REPAIR_EVERY).await;
                    let Some(node) = weak.upgrade() else { return };
                    if node.stopping.load(Ordering::Relaxed) {
                        return;
                    }
                    node.repair_round().await;
                }
            });
        }
        self.spawn(async move {
            let mut wait = CATCH_UP_FIRST;
            loop {
                tokio::time::sleep(wait).await;
                let Some(node) = weak.upgrade() else { return };
                if node.stopping.load(Ordering::Relaxed) {
                    return;
                }
                wait = if node.catch_up_catalog().await { CATCH_UP_EVERY } else { CATCH_UP_RETRY };
            }
        });
    }

    /// One round of the repair on the manager's leader (module doc).
    async fn repair_round(&self) {
        let Some(after) = self.repair_after else { return };
        let Ok(raft) = self.host.raft(manager_group()) else { return };
        if self.local_leader(manager_group()) != Some(self.me) {
            *self.repair.leading_since.lock() = None;
            self.repair.status.lock().repairing.clear();
            return;
        }
        let since = self.leading_since(raft.metrics().borrow().current_term);
        let dead = self.to_repair(after, since);
        self.repair.status.lock().repairing = dead.clone();
        let Some(&node) = dead.first() else {
            self.repair.status.lock().blocked.clear();
            return;
        };
        {
            let mut idle = self.repair.idle.lock();
            if idle.0 > 0 && idle.1 == dead {
                idle.0 -= 1;
                return;
            }
            *idle = (0, dead.clone());
        }
        let owner = MoveOwner::Repair { node };
        match self.to_manager(ManagerCall::Claim { owner }).await {
            Ok(ManagerReply::Claimed) => {}
            Ok(ManagerReply::Busy(why)) => {
                self.repair.status.lock().blocked = vec![format!("waiting for the claim on moves: {why}")];
                return;
            }
            _ => return,
        }
        let mut blocked = Vec::new();
        for _ in 0..MOVES_PER_ROUND {
            if self.stopping.load(Ordering::Relaxed) {
                break;
            }
            if !self.silent_nodes(after, since).contains(&node) && !repair_returned_for_test() {
                eprintln!("tundra: repair: node {node} reports again: its replicas left stay where they are");
                break;
            }
            blocked.clear();
            match self.repair_step(node, &mut blocked).await {
                Ok(Step::Moved(moved)) => {
                    eprintln!("tundra: repair: node {node} silent over {} s: {moved}", after.as_secs());
                    let mut status = self.repair.status.lock();
                    status.moves_total += 1;
                    status.last_repair = Some(RepairRecord { node, moved, at_unix_ms: now_unix_ms() });
                }
                Ok(Step::Nothing) => {
                    self.repair.idle.lock().0 = IDLE_ROUNDS;
                    break;
                }
                Err(why) => {
                    eprintln!("tundra: repair: a move off node {node} failed: {why:?}");
                    self.repair.status.lock().failures_total += 1;
                    blocked.push(format!("a move off node {node} failed: {why:?}"));
                    break;
                }
            }
        }
        self.release_moves(owner).await;
        self.repair.status.lock().blocked = blocked;
    }

    /// Since when (Unix ms) this node leads the manager in `term`, as it first saw it.
    fn leading_since(&self, term: u64) -> u64 {
        let mut leading = self.repair.leading_since.lock();
        if leading.is_none_or(|(seen, _)| seen != term) {
            *leading = Some((term, now_unix_ms()));
        }
        leading.map_or(0, |(_, since)| since)
    }

    /// The silent nodes that still hold replicas, lowest id first.
    fn to_repair(&self, after: Duration, since: u64) -> Vec<u64> {
        let mut dead = self.silent_nodes(after, since);
        if repair_returned_for_test() {
            // The twin's bug: a node once found dead stays dead to the repair.
            let mut seen = self.repair.status.lock().repairing.clone();
            seen.retain(|n| !dead.contains(n));
            dead.extend(seen);
            dead.sort_unstable();
        }
        dead.into_iter().filter(|&node| self.holds_replicas(node)).collect()
    }

    /// The nodes other than this one, known to the manager's state, silent for at least
    /// `after`, counted from the later of their last report and `since`.
    fn silent_nodes(&self, after: Duration, since: u64) -> Vec<u64> {
        let Some(view) = self.host.manager_view() else { return Vec::new() };
        let state = &view.lock().state;
        let now = now_unix_ms();
        state
            .nodes()
            .iter()
            .filter(|(id, n)| {
                let last = n.reported_unix_ms.unwrap_or(0).max(since);
                id.0 != self.me && now.saturating_sub(last) >= after.as_millis() as u64
            })
            .map(|(id, _)| id.0)
            .collect()
    }

    /// Whether this node's catalog lists `node` among a chunk's or a redo group's replicas.
    fn holds_replicas(&self, node: u64) -> bool {
        let catalog = self.catalog.lock();
        catalog.volumes().iter().filter(|def| !def.deleting).any(|def| {
            def.redo_replicas().contains(&node)
                || (0..chunk_spans(def.size_bytes).len() as u32).any(|index| def.holds(node, index))
        })
    }

    /// One replica moved off `node`: a redo replica first, then a chunk's. What cannot move is
    /// said in `blocked`.
    async fn repair_step(&self, node: u64, blocked: &mut Vec<String>) -> Result<Step, Refusal> {
        self.settle_all().await;
        let (state, now) = self.manager_state_now().await?;
        let up = |id: u64| {
            id == self.me
                || state
                    .node(NodeId(id))
                    .is_some_and(|n| n.status == NodeStatus::Active && !report_stale(n.reported_unix_ms, now))
        };
        let defs: Vec<VolumeDef> = self.catalog.lock().volumes().iter().filter(|def| !def.deleting).cloned().collect();
        for def in defs.iter().filter(|def| def.redo_replicas().contains(&node) && def.redo_move.is_none()) {
            match self.repair_redo(def, node, &up, blocked).await? {
                Step::Moved(moved) => return Ok(Step::Moved(moved)),
                Step::Nothing => {}
            }
        }
        for def in &defs {
            for index in 0..chunk_spans(def.size_bytes).len() as u32 {
                if !def.holds(node, index) || def.move_of(index).is_some() {
                    continue;
                }
                let replicas = def.replicas_of(index);
                let what = format!("chunk {index} of volume {:?}", def.name);
                if let Some(why) = short_of_majority(replicas, &up) {
                    blocked.push(format!("{what} stays on node {node}: {why}"));
                    continue;
                }
                let Some(to) = chunk_target(&state, def.id, index, node, replicas, &up, &self.membership.ids()) else {
                    blocked.push(format!(
                        "{what} stays on node {node}: no up active node can take it (each holds a replica or would \
                         pass 75% of its capacity); add nodes"
                    ));
                    continue;
                };
                self.execute(def, index, node, to).await?;
                return Ok(Step::Moved(format!("{what} moved to node {to}")));
            }
        }
        Ok(Step::Nothing)
    }

    /// Volume `def`'s redo replica on `node` moved to an up node (or left, when the group keeps
    /// more than three replicas and no node can take it).
    async fn repair_redo(
        &self,
        def: &VolumeDef,
        node: u64,
        up: &impl Fn(u64) -> bool,
        blocked: &mut Vec<String>,
    ) -> Result<Step, Refusal> {
        let replicas = def.redo_replicas();
        let what = format!("volume {:?}'s redo replica", def.name);
        if let Some(why) = short_of_majority(replicas, up) {
            blocked.push(format!("{what} stays on node {node}: {why}"));
            return Ok(Step::Nothing);
        }
        let target = self
            .membership
            .ids()
            .into_iter()
            .filter(|&n| up(n) && !replicas.contains(&n))
            .min_by_key(|&n| (self.redo_replicas_on(n), n));
        match target {
            Some(to) => {
                self.execute_redo_move(def, node, to).await?;
                Ok(Step::Moved(format!("{what} moved to node {to}")))
            }
            None if replicas.len() > 3 => {
                self.leave_redo(def, node).await?;
                Ok(Step::Moved(format!("{what} left (the group keeps {} replicas)", replicas.len() - 1)))
            }
            None => {
                blocked.push(format!("{what} stays on node {node}: every up node holds one already; add nodes"));
                Ok(Step::Nothing)
            }
        }
    }

    /// One pass of the catalog catch-up (module doc); answers whether every group answered.
    pub(crate) async fn catch_up_catalog(&self) -> bool {
        if catch_up_off_for_test() {
            return true;
        }
        self.learn_peers().await;
        let mut complete = self.adopt_new_volumes().await;
        let ids: Vec<u32> = self.catalog.lock().volumes().iter().filter(|def| !def.deleting).map(|d| d.id).collect();
        for volume in ids {
            let Ok(def) = self.def_of(volume) else { continue };
            for index in 0..chunk_spans(def.size_bytes).len() as u32 {
                complete &= self.catch_up_chunk(volume, index).await;
            }
            complete &= self.catch_up_redo(volume).await;
        }
        complete
    }

    /// The catch-up of chunk `index` of `volume`; false when its group did not answer or a
    /// move of it is under way.
    async fn catch_up_chunk(&self, volume: u32, index: u32) -> bool {
        let chunk = ChunkId::new(VolumeId(volume), index);
        let unmoved = |node: &ClusterNode| node.def_of(volume).ok().filter(|def| def.move_of(index).is_none());
        if unmoved(self).is_none() {
            return false;
        }
        let query = Forward::Membership { volume, chunk: index, change: MembershipChange::ConfirmedQuery };
        let Some(voters) = self.confirmed_voters(chunk, query).await else { return false };
        let Some(def) = unmoved(self) else { return false };
        let mut listed = def.replicas_of(index).to_vec();
        listed.sort_unstable();
        if listed != voters {
            // Under the catalog's lock, and only while no move is listed: a move entered since
            // the check above is the move's to settle, and must not be overwritten.
            let entered = tokio::task::block_in_place(|| {
                let mut catalog = self.catalog.lock();
                if catalog.get(volume).is_none_or(|def| def.move_of(index).is_some()) {
                    return Ok(false);
                }
                catalog.set_chunk(volume, index, voters.clone(), None).map(|()| true)
            });
            match entered {
                Ok(true) => {}
                Ok(false) => return false,
                Err(why) => {
                    eprintln!("tundra: catalog catch-up: chunk {index} of volume id {volume}: {why}");
                    return false;
                }
            }
            eprintln!(
                "tundra: catalog catch-up: chunk {index} of volume {:?} is on nodes {voters:?} (the catalog said \
                 {listed:?})",
                def.name
            );
        }
        if !voters.contains(&self.me) && self.host.raft(chunk).is_ok() {
            eprintln!(
                "tundra: catalog catch-up: node {} is no longer a replica of chunk {index} of volume {:?}: its replica \
                 stops and its pages are freed",
                self.me, def.name
            );
            if let Err(why) = self.drop_replica(volume, index).await {
                eprintln!("tundra: catalog catch-up: dropping the replica: {why:?}");
                return false;
            }
        }
        true
    }

    /// The voters of `group`, sorted, as its leader answers `query` (a `ConfirmedQuery`) within
    /// [`QUERY_WAIT`]; None when it did not answer, or the group has a learner (a move's
    /// target: its coordinator tells every catalog how the move ends) or no voter.
    async fn confirmed_voters(&self, group: ChunkId, query: Forward) -> Option<Vec<u64>> {
        let Ok(Ok((mut voters, learners))) = tokio::time::timeout(QUERY_WAIT, self.query_members(group, query)).await
        else {
            return None;
        };
        voters.sort_unstable();
        (learners.is_empty() && !voters.is_empty()).then_some(voters)
    }

    /// The catch-up of `volume`'s redo group, as [`ClusterNode::catch_up_chunk`]'s.
    async fn catch_up_redo(&self, volume: u32) -> bool {
        let group = tundra_raft::redo_machine::redo_group(volume);
        let unmoved = |node: &ClusterNode| node.def_of(volume).ok().filter(|def| def.redo_move.is_none());
        if unmoved(self).is_none() {
            return false;
        }
        let query = Forward::RedoMembership { volume, change: MembershipChange::ConfirmedQuery };
        let Some(voters) = self.confirmed_voters(group, query).await else { return false };
        let Some(def) = unmoved(self) else { return false };
        if def.redo_replicas() != voters.as_slice() {
            // As for a chunk: not over a redo move entered since the check above.
            let entered = tokio::task::block_in_place(|| {
                let mut catalog = self.catalog.lock();
                if catalog.get(volume).is_none_or(|def| def.redo_move.is_some()) {
                    return Ok(false);
                }
                catalog.set_redo(volume, voters.clone(), None).map(|()| true)
            });
            match entered {
                Ok(true) => {}
                Ok(false) => return false,
                Err(why) => {
                    eprintln!("tundra: catalog catch-up: volume id {volume}'s redo group: {why}");
                    return false;
                }
            }
            eprintln!(
                "tundra: catalog catch-up: volume {:?}'s redo group is on nodes {voters:?} (the catalog said {:?})",
                def.name,
                def.redo_replicas()
            );
        }
        if !voters.contains(&self.me) && self.host.raft(group).is_ok() {
            eprintln!(
                "tundra: catalog catch-up: node {} is no longer a replica of volume {:?}'s redo group: its replica \
                 stops",
                self.me, def.name
            );
            if let Err(why) = self.drop_redo(volume).await {
                eprintln!("tundra: catalog catch-up: dropping the redo replica: {why:?}");
                return false;
            }
        }
        true
    }
}

/// Why a group whose replicas are `replicas` must not be changed now, if its up replicas are
/// not a majority of them.
fn short_of_majority(replicas: &[u64], up: &impl Fn(u64) -> bool) -> Option<String> {
    let live = replicas.iter().filter(|&&n| up(n)).count();
    (live < replicas.len() / 2 + 1)
        .then(|| format!("only {live} of its replicas {replicas:?} are up, short of a majority"))
}

/// Where chunk `index` of volume `volume` goes off `from`: an up node without a replica of it
/// that the decision core accepts (`BeginMove`: active, kept under the fullness limit), the one
/// holding the fewest chunks (lowest id on a tie).
fn chunk_target(
    state: &ClusterState,
    volume: u32,
    index: u32,
    from: u64,
    replicas: &[u64],
    up: &impl Fn(u64) -> bool,
    nodes: &[u64],
) -> Option<u64> {
    let chunk = ChunkId::new(VolumeId(volume), index);
    let mut candidates: Vec<u64> = nodes.iter().copied().filter(|&n| up(n) && !replicas.contains(&n)).collect();
    candidates.sort_by_key(|&n| (state.node(NodeId(n)).map_or(usize::MAX, |s| s.chunks.len()), n));
    candidates.into_iter().find(|&to| {
        let planned = Move { chunk, from: NodeId(from), to: NodeId(to), reason: MoveReason::Drain };
        state.clone().apply(&Command::BeginMove(planned)).is_ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repair_after_parses_with_a_floor_a_default_and_off() {
        let with = |text: Option<&str>| {
            let config = ClusterConfig { repair_after: text.map(String::from), ..ClusterConfig::default() };
            repair_after_from_config(&config)
        };
        assert_eq!(with(None).unwrap(), Some(Duration::from_secs(600)));
        assert_eq!(with(Some("off")).unwrap(), None);
        assert_eq!(with(Some("5s")).unwrap(), Some(Duration::from_secs(5)));
        assert_eq!(with(Some(" 10m ")).unwrap(), Some(Duration::from_secs(600)));
        for (bad, why) in [("4s", "shorter than 5000 ms"), ("4999ms", "shorter than 5000 ms"), ("60", "needs a unit")] {
            let error = with(Some(bad)).unwrap_err();
            assert!(error.contains("repair_after") && error.contains(why), "{bad}: {error}");
        }
    }

    #[test]
    fn a_group_short_of_a_majority_of_up_replicas_is_not_changed() {
        let up = |n: u64| n != 3 && n != 2;
        assert!(short_of_majority(&[1, 2, 3], &up).is_some(), "one of three up");
        let up = |n: u64| n != 3;
        assert!(short_of_majority(&[1, 2, 3], &up).is_none(), "two of three up");
        assert!(short_of_majority(&[1, 3, 4, 5], &|n| n == 1 || n == 4).is_some(), "two of four up");
    }
}
