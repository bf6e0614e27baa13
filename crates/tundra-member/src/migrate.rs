//! Moving a chunk's replica from one node to another (seed 000 §4.2: the manager moves chunks;
//! the protocol is Raft's membership change), and draining a node by such moves as
//! tundra-cluster plans them.
//!
//! A move of chunk C from A to B, run by whichever node was asked (the coordinator):
//! 1. the decision core agrees (`BeginMove` on a `ClusterState` rebuilt from the catalog and
//!    the nodes' usage: B active, without a replica of C, kept under the fullness limit);
//! 2. the catalogs enter the move, so a node that restarts finds it: the coordinator's, the
//!    target's and a majority of the group's replicas' must (`tell_nodes`), the source may be
//!    dead, and a node that missed it catches up from the group's membership later
//!    (dead_nodes.rs);
//! 3. B starts an empty replica of C's group (B's store has the volume already: every node
//!    creates it);
//! 4. C's leader adds B as a learner and answers once B caught up, from the log or from a
//!    snapshot of the chunk's stored, compressed images (never compressed again);
//! 5. C's leader makes the voters the old set without A and with B (openraft's joint
//!    consensus: one membership change per group at a time);
//! 6. A drops its replica (stops the group, frees the chunk's pages) and every catalog learns
//!    the new replica set, the move removed.
//!
//! Clients keep reading and writing through it: their requests go to C's leader, which keeps
//! serving while the membership changes. A move that fails before step 5 committed is rolled
//! back: the learner removed, B's replica dropped, the catalogs told the old set. A move whose
//! outcome is unknown (the coordinator died, the leader changed during step 5) is settled from
//! the group's own membership: B a voter means finished, otherwise rolled back. Every node
//! settles the moves its catalog lists when it starts, and a drain or move settles them first.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tundra_cluster::{ClusterState, Command, ManagerConfig, Move, MoveReason, NodeId, Policy};
use tundra_store::ids::{ChunkId, VolumeId};

use crate::cluster::{ClusterNode, chunk_spans};
use crate::messages::{Answer, ChunkMove, Forward, MembershipChange, Refusal, VolumeDef};

/// How long a learner may take to catch up before its move is rolled back.
pub const CATCH_UP_LIMIT: Duration = Duration::from_secs(30);

/// A cluster operation `tundra cluster` asks of a node (the CLUSTER_ADMIN request's JSON).
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdminRequest {
    /// Move one chunk off a draining node; answers what is left.
    DrainStep {
        node: u64,
    },
    Move {
        volume: String,
        chunk: u32,
        from: u64,
        to: u64,
    },
    /// Moves volume `volume`'s redo replica from node `from` to node `to`.
    MoveRedo {
        volume: String,
        from: u64,
        to: u64,
    },
    /// Adds node `peer` (`"ID@HOST:PORT"`) to the running cluster (join.rs); answers a
    /// `JoinReport`.
    AddNode {
        peer: String,
    },
    /// Plan under `policy` (`logical` or `compression-aware`) and, unless `dry_run`, make the
    /// plan's first move not in `skip` (rebalance.rs); answers a `RebalanceProgress`.
    RebalanceStep {
        policy: String,
        #[serde(default)]
        dry_run: bool,
        #[serde(default)]
        skip: Vec<crate::rebalance::SkippedMove>,
        /// The command line's run: its steps share the claim on moves (manager.rs).
        #[serde(default)]
        run: u64,
    },
}

/// What a drain step did.
#[derive(Debug, Serialize, Deserialize)]
pub struct DrainProgress {
    /// The chunk replicas the node still holds.
    pub chunks_left: usize,
    /// The move made: volume name, chunk index, target node.
    pub moved: Option<(String, u32, u64)>,
    /// The replicas of volumes' redo groups the node still holds.
    #[serde(default)]
    pub redo_left: usize,
    /// The redo replica moved: volume name, target node.
    #[serde(default)]
    pub redo_moved: Option<(String, u64)>,
}

impl ClusterNode {
    /// Answers a cluster operation (JSON in, JSON out).
    pub fn admin(&self, request: &str) -> Result<String, Refusal> {
        let request: AdminRequest =
            serde_json::from_str(request).map_err(|e| Refusal::Invalid(format!("a cluster operation: {e}")))?;
        let answer = match request {
            AdminRequest::DrainStep { node } => serde_json::to_value(self.drain_step(node)?),
            AdminRequest::Move { volume, chunk, from, to } => {
                self.move_replica(&volume, chunk, from, to)?;
                Ok(serde_json::json!({ "moved": true }))
            }
            AdminRequest::MoveRedo { volume, from, to } => {
                self.move_redo_replica(&volume, from, to)?;
                Ok(serde_json::json!({ "moved": true }))
            }
            AdminRequest::AddNode { peer } => serde_json::to_value(self.block_on(self.add_node(&peer))?),
            AdminRequest::RebalanceStep { policy, dry_run, skip, run } => {
                let owner = crate::manager::MoveOwner::Rebalance { node: self.me, run };
                serde_json::to_value(self.rebalance_step(&policy, dry_run, &skip, owner)?)
            }
        };
        answer.map(|v| v.to_string()).map_err(|e| Refusal::Invalid(e.to_string()))
    }

    /// Moves one chunk replica off `node`, as tundra-cluster's plan for a drain chooses, or
    /// says that the node holds nothing more; refuses when no other node can take the chunk.
    pub fn drain_step(&self, node: u64) -> Result<DrainProgress, Refusal> {
        if !self.membership.ids().contains(&node) {
            return Err(Refusal::Invalid(format!("node {node} is not a member of this cluster")));
        }
        // One mover at a time (manager.rs): a background round or a rebalance run waits. The
        // claim is given back when the node is empty or a step fails; between steps the
        // command line's next one renews it.
        let owner = crate::manager::MoveOwner::Drain { node };
        self.block_on(self.claim_moves(owner))?;
        let step = self.claimed_drain_step(node);
        // Empty: the manager keeps three members once the node is retired (manager_members.rs).
        let step = step.and_then(|p| {
            if p.chunks_left + p.redo_left == 0 {
                self.block_on(self.manager_member_off(node)).map(|()| p)
            } else {
                Ok(p)
            }
        });
        if !matches!(&step, Ok(progress) if progress.chunks_left + progress.redo_left > 0) {
            self.block_on(self.release_moves(owner));
        }
        step
    }

    /// [`ClusterNode::drain_step`] once it holds the claim on moves.
    fn claimed_drain_step(&self, node: u64) -> Result<DrainProgress, Refusal> {
        self.block_on(self.settle_all());
        // The manager's leader marks the node draining and plans the move (manager.rs).
        let (held, planned) = self.block_on(self.manager_drain_plan(node))?;
        // The node's redo replicas move first, while its chunks are still there.
        if let Some(redo_moved) = self.drain_redo_step(node)? {
            let redo_left = self.redo_replicas_on(node);
            return Ok(DrainProgress { chunks_left: held.len(), moved: None, redo_left, redo_moved: Some(redo_moved) });
        }
        let Some(&first) = held.first() else {
            return Ok(DrainProgress { chunks_left: 0, moved: None, redo_left: 0, redo_moved: None });
        };
        let planned = planned.ok_or_else(|| {
            Refusal::Invalid(format!(
                "the remaining nodes cannot take chunk {} of volume id {} from node {node}: every other active node \
                 holds a replica of it or would pass 75% of its logical or physical capacity; add nodes",
                first.index(),
                first.volume().0
            ))
        })?;
        let def = self.def_of(planned.chunk.volume().0)?;
        self.block_on(self.execute(&def, planned.chunk.index(), node, planned.to.0))?;
        let moved = Some((def.name.clone(), planned.chunk.index(), planned.to.0));
        Ok(DrainProgress { chunks_left: held.len() - 1, moved, redo_left: 0, redo_moved: None })
    }

    /// Moves chunk `chunk` of volume `volume` from node `from` to node `to`.
    pub fn move_replica(&self, volume: &str, chunk: u32, from: u64, to: u64) -> Result<(), Refusal> {
        let def = self.catalog.lock().volumes().iter().find(|v| v.name == volume).cloned();
        let def = def.ok_or_else(|| Refusal::Invalid(format!("no replicated volume is named {volume:?}")))?;
        if chunk as usize >= chunk_spans(def.size_bytes).len() {
            return Err(Refusal::Invalid(format!("volume {volume:?} has no chunk {chunk}")));
        }
        let owner = crate::manager::MoveOwner::Move { node: self.me };
        self.block_on(self.claim_moves(owner))?;
        let done = self.claimed_move(def, chunk, from, to);
        self.block_on(self.release_moves(owner));
        done
    }

    /// [`ClusterNode::move_replica`] once it holds the claim on moves.
    fn claimed_move(&self, def: VolumeDef, chunk: u32, from: u64, to: u64) -> Result<(), Refusal> {
        self.block_on(self.settle_all());
        let mut state = self.manager_state()?;
        let planned = Move {
            chunk: ChunkId::new(VolumeId(def.id), chunk),
            from: NodeId(from),
            to: NodeId(to),
            reason: MoveReason::Drain,
        };
        state.apply(&Command::BeginMove(planned)).map_err(|e| Refusal::Invalid(e.message().into()))?;
        let def = self.def_of(def.id)?;
        self.block_on(self.execute(&def, chunk, from, to))
    }

    pub(crate) fn def_of(&self, volume: u32) -> Result<VolumeDef, Refusal> {
        self.catalog.lock().get(volume).cloned().ok_or_else(|| Refusal::Invalid(format!("volume id {volume} is gone")))
    }

    /// The decision state for a drain or a single move: the logical policy, one move at a time
    /// (rebalance.rs's `decision_state` is the one source of decisions).
    fn manager_state(&self) -> Result<ClusterState, Refusal> {
        let mut config = ManagerConfig::paper(Policy::Logical);
        config.throttle.max_moves = 1;
        self.decision_state(config).map(|(state, _)| state)
    }

    /// Carries out a move the decision core accepted: finished, or rolled back and refused.
    pub(crate) async fn execute(&self, def: &VolumeDef, index: u32, from: u64, to: u64) -> Result<(), Refusal> {
        let chunk = ChunkId::new(VolumeId(def.id), index);
        let old: Vec<u64> = def.replicas_of(index).to_vec();
        let moving = ChunkMove { chunk: index, from, to };
        // A target added to the cluster since the volume's creation may not know it yet.
        if let Some(why) = refused(self.ask(to, Forward::Adopt(def.clone())).await) {
            return Err(why);
        }
        let begun = self.tell_all(def.id, index, old.clone(), Some(moving)).await;
        // The cluster manager's state takes the move once the catalogs hold it (manager.rs).
        let begun = match begun {
            Ok(()) => self.manager_begin(def.id, moving).await,
            Err(why) => Err(why),
        };
        let caught_up = match begun {
            Ok(()) => self.begin_on_target(def.id, chunk, to).await,
            Err(why) => Err(why),
        };
        if let Err(why) = caught_up {
            self.roll_back(def.id, chunk, moving, old).await;
            self.manager_end(def.id, moving, false).await;
            return Err(why);
        }
        let voters: Vec<u64> = old.iter().copied().filter(|&n| n != from).chain([to]).collect();
        let changed = self
            .to_leader(
                chunk,
                Forward::Membership { volume: def.id, chunk: index, change: MembershipChange::Voters(voters) },
            )
            .await;
        // The group's membership changed (the move finished, whether or not every catalog
        // learned it yet) or was rolled back: the manager is told which; an unknown outcome
        // stays in flight there until its leader settles it.
        let (finished, done) = match changed {
            Ok(_) => (Some(true), self.finish(def.id, chunk, moving).await),
            // The change may have committed unseen: the group's membership says.
            Err(why) => match self.settle(def.id, moving).await {
                Ok(true) => (Some(true), Ok(())),
                Ok(false) => (Some(false), Err(why)),
                Err(_) => (None, Err(why)),
            },
        };
        if let Some(finished) = finished {
            self.manager_end(def.id, moving, finished).await;
        }
        done
    }

    /// Steps 3 and 4: an empty replica on `to`, added as a learner and caught up. The target
    /// must not be one of the group's voters: it starts its replica afresh, forgetting any it
    /// held before.
    async fn begin_on_target(&self, volume: u32, chunk: ChunkId, to: u64) -> Result<(), Refusal> {
        let (voters, _) = self.members(volume, chunk).await?;
        not_a_voter(to, &voters, &format!("chunk {}'s", chunk.index()))?;
        if let Some(why) = refused(self.ask(to, Forward::StartReplica { volume, chunk: chunk.index() }).await) {
            return Err(why);
        }
        let add = Forward::Membership { volume, chunk: chunk.index(), change: MembershipChange::AddLearner(to) };
        let limit = catch_up_limit();
        match tokio::time::timeout(limit, self.to_leader(chunk, add)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(why)) => Err(why),
            Err(_) => Err(Refusal::Unavailable(format!(
                "node {to} did not catch up with chunk {} within {limit:?}",
                chunk.index()
            ))),
        }
    }

    /// Step 6: the source's replica dropped and the new set entered everywhere. A source that
    /// does not answer drops its replica when it settles the move at its next start.
    async fn finish(&self, volume: u32, chunk: ChunkId, moving: ChunkMove) -> Result<(), Refusal> {
        let (voters, _) = self.members(volume, chunk).await?;
        let _ = self.ask(moving.from, Forward::DropReplica { volume, chunk: chunk.index() }).await;
        self.tell_all(volume, chunk.index(), voters.clone(), None).await.map_err(|why| {
            Refusal::Unavailable(format!(
                "the move finished (chunk {} is on nodes {voters:?}), but not every node learned it yet; a node \
                 learns it when it next starts: {why:?}",
                chunk.index()
            ))
        })
    }

    /// The learner removed, the target's replica dropped, the old set entered everywhere.
    async fn roll_back(&self, volume: u32, chunk: ChunkId, moving: ChunkMove, old: Vec<u64>) {
        let remove =
            Forward::Membership { volume, chunk: chunk.index(), change: MembershipChange::RemoveLearner(moving.to) };
        if self.to_leader(chunk, remove).await.is_err() {
            // The move stays in the catalogs, to be settled later.
            return;
        }
        let _ = self.ask(moving.to, Forward::DropReplica { volume, chunk: chunk.index() }).await;
        let _ = self.tell_all(volume, chunk.index(), old, None).await;
    }

    /// Finishes or rolls back a move whose outcome is unknown, from the group's membership at
    /// its leader; answers whether it finished.
    pub(crate) async fn settle(&self, volume: u32, moving: ChunkMove) -> Result<bool, Refusal> {
        let chunk = ChunkId::new(VolumeId(volume), moving.chunk);
        let (voters, _) = self.members(volume, chunk).await?;
        if voters.contains(&moving.to) {
            if voters.contains(&moving.from) {
                // A joint configuration left by a coordinator that stopped: complete it.
                let target: Vec<u64> = voters.iter().copied().filter(|&n| n != moving.from).collect();
                let change = MembershipChange::Voters(target);
                self.to_leader(chunk, Forward::Membership { volume, chunk: moving.chunk, change }).await?;
            }
            let finished = self.finish(volume, chunk, moving).await;
            self.manager_end(volume, moving, true).await;
            finished?;
            return Ok(true);
        }
        self.roll_back(volume, chunk, moving, voters).await;
        self.manager_end(volume, moving, false).await;
        Ok(false)
    }

    /// Settles every move this node's catalog lists: chunks' and redo groups'.
    pub(crate) async fn settle_all(&self) {
        let moves: Vec<(u32, ChunkMove)> =
            self.catalog.lock().volumes().iter().flat_map(|def| def.moves.iter().map(move |m| (def.id, *m))).collect();
        for (volume, moving) in moves {
            let _ = self.settle(volume, moving).await;
        }
        if test_redo_settle_off() {
            return;
        }
        let redo_moves: Vec<(u32, crate::messages::RedoMove)> =
            self.catalog.lock().volumes().iter().filter_map(|def| def.redo_move.map(|m| (def.id, m))).collect();
        for (volume, moving) in redo_moves {
            let _ = self.settle_redo(volume, moving).await;
        }
    }

    async fn members(&self, volume: u32, chunk: ChunkId) -> Result<(Vec<u64>, Vec<u64>), Refusal> {
        let query = Forward::Membership { volume, chunk: chunk.index(), change: MembershipChange::Query };
        self.query_members(chunk, query).await
    }

    /// The voters and learners of `group` as its leader answers `query` (a chunk's or a redo
    /// group's membership query).
    pub(crate) async fn query_members(&self, group: ChunkId, query: Forward) -> Result<(Vec<u64>, Vec<u64>), Refusal> {
        match self.to_leader(group, query).await? {
            Answer::Members { voters, learners } => Ok((voters, learners)),
            other => Err(Refusal::Unavailable(format!("a membership query answered {other:?}"))),
        }
    }

    /// Enters a chunk's replica set and move in the catalogs of every node that answers
    /// ([`ClusterNode::tell_nodes`] says which must).
    async fn tell_all(
        &self,
        volume: u32,
        chunk: u32,
        replicas: Vec<u64>,
        moving: Option<ChunkMove>,
    ) -> Result<(), Refusal> {
        let mut replicas = replicas;
        replicas.sort_unstable();
        let must: Vec<u64> = moving.map(|m| m.to).into_iter().collect();
        let set = |_node: u64| Forward::SetChunk { volume, chunk, replicas: replicas.clone(), moving };
        self.tell_nodes(set, &must, &replicas).await
    }

    /// Asks every node of the cluster to enter a change of one group's replica set in its
    /// catalog (`forward_to(node)`), and answers whether enough of them did. Which must
    /// answer (seed 000 §4.2: a dead node's replicas are moved while it is down):
    ///
    /// - this node, the coordinator, which settles the change if it stops halfway;
    /// - every node of `must` (a move's target, which restarts its new replica from its
    ///   catalog and which the catalog catch-up must not take for a stale replica);
    /// - a majority of `replicas` (the set the change starts from, or ends at): the group
    ///   itself needs that majority to commit the membership change, and each of them settles
    ///   the move at its start.
    ///
    /// A node that does not answer (dead, or cut off) learns the change from the groups'
    /// own membership when it next catches its catalog up (dead_nodes.rs), at its start and
    /// then periodically; until then its stale catalog only costs it a redirected request.
    async fn tell_nodes(
        &self,
        forward_to: impl Fn(u64) -> Forward,
        must: &[u64],
        replicas: &[u64],
    ) -> Result<(), Refusal> {
        let mut missed = Vec::new();
        let mut why_missed = None;
        for node in self.membership.ids() {
            if let Some(why) = refused(self.ask(node, forward_to(node)).await) {
                missed.push(node);
                why_missed = Some(why);
            }
        }
        let needed: Vec<u64> = must.iter().copied().chain([self.me]).collect();
        let answered_replicas = replicas.iter().filter(|n| !missed.contains(n)).count();
        let short = needed.iter().any(|n| missed.contains(n)) || answered_replicas < replicas.len() / 2 + 1;
        if short {
            return Err(Refusal::Unavailable(format!(
                "nodes {missed:?} did not enter the change (needed: nodes {needed:?} and a majority of {replicas:?}): {why_missed:?}"
            )));
        }
        if !missed.is_empty() {
            eprintln!(
                "tundra: nodes {missed:?} did not enter a change of a group's replicas ({why_missed:?}); they catch up from the group when they answer again"
            );
        }
        Ok(())
    }

    /// A move's target: starts the chunk's group here, empty. A node that held a replica of
    /// it before (a move took it away, or a move here was rolled back, perhaps cut short by a
    /// crash) forgets what is left of it first (tundra-raft's `Host::forget_group_on`): the
    /// coordinator asked only after the group's leader said this node is not one of its voters
    /// ([`ClusterNode::begin_on_target`]), so nothing the group decided depends on that log.
    pub(crate) async fn start_replica(&self, volume: u32, chunk: u32) -> Result<Answer, Refusal> {
        let id = ChunkId::new(VolumeId(volume), chunk);
        if self.host.raft(id).is_ok() {
            return Ok(Answer::Done);
        }
        let v = self.node.volume(VolumeId(volume)).map_err(|e| Refusal::Invalid(e.to_string()))?;
        if self.host.has_log_of(id) {
            self.host.forget_group_on(id, v.pages().clone()).await.map_err(Refusal::Unavailable)?;
        }
        self.host.add_group_on(id, v.pages().clone()).await.map_err(Refusal::Unavailable)?;
        Ok(Answer::Done)
    }

    pub(crate) async fn drop_replica(&self, volume: u32, chunk: u32) -> Result<Answer, Refusal> {
        let id = ChunkId::new(VolumeId(volume), chunk);
        if self.host.raft(id).is_err() {
            return Ok(Answer::Done);
        }
        self.host.drop_group(id).await.map_err(Refusal::Unavailable)?;
        Ok(Answer::Done)
    }

    /// At the leader, after `node` was added as a learner of `chunk`: waits until its log
    /// matches the leader's last entry as it was when the learner was added, for at most the
    /// catch-up limit (the coordinator gives up then too).
    async fn wait_caught_up(&self, chunk: ChunkId, node: u64) -> Result<(), Refusal> {
        let (_, goal) = self.host.replication_of(chunk, node).map_err(crate::io::refusal)?;
        let deadline = tokio::time::Instant::now() + catch_up_limit();
        loop {
            let (matched, _) = self.host.replication_of(chunk, node).map_err(crate::io::refusal)?;
            if matched >= goal {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Refusal::Unavailable(format!(
                    "node {node} did not catch up with chunk {} (matched {matched:?} of {goal:?})",
                    chunk.index()
                )));
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// A membership change of a chunk's group, here as its leader.
    pub(crate) async fn change_membership(
        &self,
        volume: u32,
        chunk: u32,
        change: MembershipChange,
    ) -> Result<Answer, Refusal> {
        self.change_group_membership(ChunkId::new(VolumeId(volume), chunk), change).await
    }

    /// A membership change of group `id` (a chunk's, or a volume's redo group), here as its
    /// leader.
    async fn change_group_membership(&self, id: ChunkId, change: MembershipChange) -> Result<Answer, Refusal> {
        let leader = self.local_leader(id);
        if leader != Some(self.me) {
            return Err(Refusal::NotLeader { leader });
        }
        // What settles a move (a query, a learner's removal) is answered only by a leader a
        // quorum just confirmed: a deposed one that still believes it leads would answer from
        // a stale membership (and "no such learner" without committing anything), and the
        // coordinator would then forget a replica the group still counts.
        if matches!(
            change,
            MembershipChange::Query | MembershipChange::ConfirmedQuery | MembershipChange::RemoveLearner(_)
        ) {
            let raft = self.host.raft(id).map_err(crate::io::refusal)?;
            raft.ensure_linearizable().await.map_err(|e| match e {
                openraft::error::RaftError::APIError(openraft::error::CheckIsLeaderError::ForwardToLeader(f)) => {
                    Refusal::NotLeader { leader: f.leader_id }
                }
                other => Refusal::Unavailable(other.to_string()),
            })?;
        }
        let done = match change {
            MembershipChange::Query => Ok(()),
            MembershipChange::ConfirmedQuery => {
                // A membership change under way (joint, or not applied yet) is not an answer
                // a catalog may take: asked again later.
                if let Some(why) = self.host.membership_unsettled(id).map_err(crate::io::refusal)? {
                    return Err(Refusal::Unavailable(why));
                }
                Ok(())
            }
            MembershipChange::AddLearner(node) => {
                let _pacing = self.transport.pace().catching_up(id.0, node);
                test_catch_up_delay().await;
                self.host.add_learner(id, node).await.map_err(crate::io::refusal)?;
                self.wait_caught_up(id, node).await?;
                Ok(())
            }
            MembershipChange::Voters(voters) => self.host.change_voters(id, voters.into_iter().collect()).await,
            MembershipChange::RemoveLearner(node) => match self.host.members(id) {
                Ok((_, learners)) if !learners.contains(&node) => Ok(()),
                _ => self.host.remove_learner(id, node).await,
            },
        };
        done.map_err(crate::io::refusal)?;
        let (voters, learners) = self.host.members(id).map_err(crate::io::refusal)?;
        Ok(Answer::Members { voters: voters.into_iter().collect(), learners: learners.into_iter().collect() })
    }
}

/// The checks of a redo replica's move on a catalog's definition: the source holds a replica,
/// the target none.
fn check_redo_move(def: &VolumeDef, from: u64, to: u64) -> Result<(), Refusal> {
    let replicas = def.redo_replicas();
    if !replicas.contains(&from) {
        return Err(Refusal::Invalid(format!(
            "node {from} holds no replica of volume {:?}'s redo stream (its replicas are on nodes {replicas:?})",
            def.name
        )));
    }
    if replicas.contains(&to) {
        return Err(Refusal::Invalid(format!(
            "node {to} already holds a replica of volume {:?}'s redo stream (its replicas are on nodes {replicas:?})",
            def.name
        )));
    }
    Ok(())
}

/// [`CATCH_UP_LIMIT`], or `TUNDRA_TEST_CATCH_UP_LIMIT_MS` (a test-only hook, so that a kill
/// test's rollback does not wait 30 seconds).
fn catch_up_limit() -> std::time::Duration {
    let limit = std::env::var("TUNDRA_TEST_CATCH_UP_LIMIT_MS").ok().and_then(|v| v.parse::<u64>().ok());
    limit.map_or(CATCH_UP_LIMIT, std::time::Duration::from_millis)
}

/// A test-only hook: `TUNDRA_TEST_CATCH_UP_DELAY_MS` holds a learner's catch-up at its leader
/// for that long, so that a test can kill a move's source or target before the voters change
/// and the rollback path runs. Unset in production.
async fn test_catch_up_delay() {
    let delay = std::env::var("TUNDRA_TEST_CATCH_UP_DELAY_MS").ok().and_then(|v| v.parse::<u64>().ok());
    if let Some(ms) = delay {
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    }
}

/// A test-only hook: `TUNDRA_TEST_REDO_MOVE_STOP=after-catch-up` (or `after-voters`) makes the
/// coordinator of a redo replica's move stop there, as if it died: the move stays in the
/// catalogs for [`ClusterNode::settle_redo`]. Unset in production.
fn test_redo_move_stop(at: &str) -> Option<Refusal> {
    let stop = std::env::var("TUNDRA_TEST_REDO_MOVE_STOP").is_ok_and(|v| v == at);
    stop.then(|| Refusal::Unavailable(format!("the move's coordinator stopped {at} (TUNDRA_TEST_REDO_MOVE_STOP)")))
}

/// A test-only hook: `TUNDRA_TEST_REDO_SETTLE=off` leaves redo moves unsettled (the behaviour
/// before they were settled), for the twin of the settling test. Unset in production.
fn test_redo_settle_off() -> bool {
    std::env::var("TUNDRA_TEST_REDO_SETTLE").is_ok_and(|v| v == "off")
}

/// Refuses a move's target that is one of the group's `voters` already (`group`: whose, for
/// the message): it starts its replica afresh, forgetting any it held.
fn not_a_voter(to: u64, voters: &[u64], group: &str) -> Result<(), Refusal> {
    if voters.contains(&to) {
        return Err(Refusal::Invalid(format!("node {to} is one of {group} voters {voters:?} already")));
    }
    Ok(())
}

fn refused(answer: Result<Answer, Refusal>) -> Option<Refusal> {
    answer.err()
}

/// Moving a replica of a volume's redo group (its stream's Raft group) from one node to
/// another, by the steps of a chunk's move: every catalog enters the move, the target starts
/// the group's replica, the redo leader adds it as a learner and waits until it caught up
/// (from the log, or from a copy of the stream: tundra-raft's `redo_machine`), makes the
/// voters the old set without the source and with the target, the source stops its replica
/// and drops its stream, and every catalog learns the new set. A move that fails before the
/// voter change is rolled back. A move whose outcome is unknown (its coordinator died) is
/// settled from the group's membership as a chunk's is ([`ClusterNode::settle_redo`]).
impl ClusterNode {
    /// Moves volume `volume`'s redo replica from node `from` to node `to` (`tundra cluster
    /// move --redo`).
    pub fn move_redo_replica(&self, volume: &str, from: u64, to: u64) -> Result<(), Refusal> {
        let def = self.catalog.lock().volumes().iter().find(|v| v.name == volume).cloned();
        let def = def.ok_or_else(|| Refusal::Invalid(format!("no replicated volume is named {volume:?}")))?;
        let members = self.membership.ids();
        if let Some(unknown) = [from, to].into_iter().find(|n| !members.contains(n)) {
            return Err(Refusal::Invalid(format!("node {unknown} is not a member of this cluster")));
        }
        if from == to {
            return Err(Refusal::Invalid(format!("a move from node {from} to itself")));
        }
        check_redo_move(&def, from, to)?;
        let owner = crate::manager::MoveOwner::Move { node: self.me };
        self.block_on(self.claim_moves(owner))?;
        let done = self.claimed_redo_move(def.id, from, to);
        self.block_on(self.release_moves(owner));
        done
    }

    /// [`ClusterNode::move_redo_replica`] once it holds the claim on moves: the checks again
    /// on the catalog as settling left it.
    fn claimed_redo_move(&self, volume: u32, from: u64, to: u64) -> Result<(), Refusal> {
        self.block_on(self.settle_all());
        let def = self.def_of(volume)?;
        if let Some(m) = def.redo_move {
            return Err(Refusal::Unavailable(format!(
                "a move of volume {:?}'s redo replica from node {} to node {} is under way and could not be settled \
                 yet; try again",
                def.name, m.from, m.to
            )));
        }
        check_redo_move(&def, from, to)?;
        let state = self.manager_state()?;
        let target = state.nodes().get(&NodeId(to)).map(|n| n.status);
        if target.is_some_and(|s| s != tundra_cluster::state::NodeStatus::Active) {
            return Err(Refusal::Invalid(format!("node {to} is draining or dead: it takes no replica")));
        }
        self.block_on(self.execute_redo_move(&def, from, to))
    }

    /// Moves one redo replica off a draining `node`, if it holds any; answers the volume's
    /// name and the target, or `None` when the node holds no redo replica.
    pub(crate) fn drain_redo_step(&self, node: u64) -> Result<Option<(String, u64)>, Refusal> {
        let held: Vec<VolumeDef> =
            self.catalog.lock().volumes().iter().filter(|def| def.redo_replicas().contains(&node)).cloned().collect();
        let Some(def) = held.into_iter().next() else { return Ok(None) };
        match self.redo_target(&def, node) {
            Ok(to) => {
                self.block_on(self.execute_redo_move(&def, node, to))?;
                Ok(Some((def.name, to)))
            }
            // Every other node holds one already (the group runs on every node that held a
            // chunk at the volume's creation): the node leaves it, if three stay.
            Err(_) if def.redo_replicas().len() > 3 => {
                self.block_on(self.leave_redo(&def, node))?;
                Ok(Some((def.name, 0)))
            }
            Err(why) => Err(why),
        }
    }

    /// Removes `from` from the volume's redo group, the others staying: the voters changed,
    /// its replica dropped, every catalog told.
    pub(crate) async fn leave_redo(&self, def: &VolumeDef, from: u64) -> Result<(), Refusal> {
        let group = tundra_raft::redo_machine::redo_group(def.id);
        let voters: Vec<u64> = def.redo_replicas().iter().copied().filter(|&n| n != from).collect();
        let change = MembershipChange::Voters(voters);
        self.to_leader(group, Forward::RedoMembership { volume: def.id, change }).await?;
        self.finish_redo(def.id, crate::messages::RedoMove { from, to: from }).await
    }

    /// The redo replicas a node holds.
    pub(crate) fn redo_replicas_on(&self, node: u64) -> usize {
        self.catalog.lock().volumes().iter().filter(|def| def.redo_replicas().contains(&node)).count()
    }

    /// Where a redo replica of `def` leaving `from` goes: a node without one that is neither
    /// the source nor draining, the one holding the fewest redo replicas (lowest id on a tie).
    fn redo_target(&self, def: &VolumeDef, from: u64) -> Result<u64, Refusal> {
        let state = self.manager_state()?;
        let draining: Vec<u64> = state
            .nodes()
            .iter()
            .filter(|(_, n)| n.status != tundra_cluster::state::NodeStatus::Active)
            .map(|(id, _)| id.0)
            .collect();
        let candidates = self
            .membership
            .ids()
            .into_iter()
            .filter(|n| *n != from && !def.redo_replicas().contains(n) && !draining.contains(n));
        candidates.min_by_key(|&n| (self.redo_replicas_on(n), n)).ok_or_else(|| {
            Refusal::Invalid(format!(
                "no node can take node {from}'s replica of volume {:?}'s redo stream: every other active node holds \
                 one; add nodes",
                def.name
            ))
        })
    }

    /// Carries out a redo replica's move: finished, or rolled back and refused.
    pub(crate) async fn execute_redo_move(&self, def: &VolumeDef, from: u64, to: u64) -> Result<(), Refusal> {
        let group = tundra_raft::redo_machine::redo_group(def.id);
        let old: Vec<u64> = def.redo_replicas().to_vec();
        let moving = crate::messages::RedoMove { from, to };
        if let Some(why) = refused(self.ask(to, Forward::Adopt(def.clone())).await) {
            return Err(why);
        }
        let begun = self.tell_all_redo(def.id, old.clone(), Some(moving)).await;
        let caught_up = match begun {
            Ok(()) => self.begin_redo_on_target(def.id, to).await,
            Err(why) => Err(why),
        };
        if let Err(why) = caught_up {
            self.roll_back_redo(def.id, moving, old).await;
            return Err(why);
        }
        if let Some(stopped) = test_redo_move_stop("after-catch-up") {
            return Err(stopped);
        }
        let voters: Vec<u64> = old.iter().copied().filter(|&n| n != from).chain([to]).collect();
        let change = MembershipChange::Voters(voters);
        match self.to_leader(group, Forward::RedoMembership { volume: def.id, change }).await {
            Ok(_) => match test_redo_move_stop("after-voters") {
                Some(stopped) => Err(stopped),
                None => self.finish_redo(def.id, moving).await,
            },
            // The change may have committed unseen: the group's membership says.
            Err(why) => match self.redo_members(def.id).await {
                Ok((voters, _)) if voters.contains(&to) && !voters.contains(&from) => {
                    self.finish_redo(def.id, moving).await
                }
                Ok((voters, _)) if !voters.contains(&to) => {
                    self.roll_back_redo(def.id, moving, voters).await;
                    Err(why)
                }
                _ => Err(why),
            },
        }
    }

    /// The target's replica started, added as a learner and caught up. The target must not be
    /// one of the group's voters, as for a chunk ([`ClusterNode::begin_on_target`]).
    async fn begin_redo_on_target(&self, volume: u32, to: u64) -> Result<(), Refusal> {
        let (voters, _) = self.redo_members(volume).await?;
        not_a_voter(to, &voters, &format!("volume id {volume}'s redo"))?;
        if let Some(why) = refused(self.ask(to, Forward::StartRedo { volume }).await) {
            return Err(why);
        }
        let group = tundra_raft::redo_machine::redo_group(volume);
        let add = Forward::RedoMembership { volume, change: MembershipChange::AddLearner(to) };
        let limit = catch_up_limit();
        match tokio::time::timeout(limit, self.to_leader(group, add)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(why)) => Err(why),
            Err(_) => Err(Refusal::Unavailable(format!(
                "node {to} did not catch up with volume id {volume}'s redo within {limit:?}"
            ))),
        }
    }

    /// The source's replica dropped and the new set entered everywhere.
    async fn finish_redo(&self, volume: u32, moving: crate::messages::RedoMove) -> Result<(), Refusal> {
        let (voters, _) = self.redo_members(volume).await?;
        let _ = self.ask(moving.from, Forward::DropRedo { volume }).await;
        self.tell_all_redo(volume, voters.clone(), None).await.map_err(|why| {
            Refusal::Unavailable(format!(
                "the move finished (volume id {volume}'s redo is on nodes {voters:?}), but not every node learned it \
                 yet: {why:?}"
            ))
        })
    }

    /// The learner removed, the target's replica dropped, the old set entered everywhere.
    async fn roll_back_redo(&self, volume: u32, moving: crate::messages::RedoMove, old: Vec<u64>) {
        let group = tundra_raft::redo_machine::redo_group(volume);
        let remove = Forward::RedoMembership { volume, change: MembershipChange::RemoveLearner(moving.to) };
        if self.to_leader(group, remove).await.is_err() {
            return;
        }
        let _ = self.ask(moving.to, Forward::DropRedo { volume }).await;
        let _ = self.tell_all_redo(volume, old, None).await;
    }

    /// Finishes or rolls back a redo move whose outcome is unknown (its coordinator died),
    /// from the group's membership at its leader, by the rules of a chunk's
    /// ([`ClusterNode::settle`]): the target a voter means finished (a joint configuration
    /// completed first), otherwise rolled back, the learner removed. Answers whether it
    /// finished.
    pub(crate) async fn settle_redo(&self, volume: u32, moving: crate::messages::RedoMove) -> Result<bool, Refusal> {
        let group = tundra_raft::redo_machine::redo_group(volume);
        let (voters, _) = self.redo_members(volume).await?;
        if voters.contains(&moving.to) {
            if voters.contains(&moving.from) {
                let target: Vec<u64> = voters.iter().copied().filter(|&n| n != moving.from).collect();
                let change = MembershipChange::Voters(target);
                self.to_leader(group, Forward::RedoMembership { volume, change }).await?;
            }
            self.finish_redo(volume, moving).await?;
            return Ok(true);
        }
        self.roll_back_redo(volume, moving, voters).await;
        Ok(false)
    }

    async fn redo_members(&self, volume: u32) -> Result<(Vec<u64>, Vec<u64>), Refusal> {
        let group = tundra_raft::redo_machine::redo_group(volume);
        let query = Forward::RedoMembership { volume, change: MembershipChange::Query };
        self.query_members(group, query).await
    }

    /// Enters the redo group's replica set and move in the catalogs of every node that
    /// answers ([`ClusterNode::tell_nodes`] says which must).
    async fn tell_all_redo(
        &self,
        volume: u32,
        replicas: Vec<u64>,
        moving: Option<crate::messages::RedoMove>,
    ) -> Result<(), Refusal> {
        let must: Vec<u64> = moving.map(|m| m.to).into_iter().collect();
        let set = |_node: u64| Forward::SetRedo { volume, replicas: replicas.clone(), moving };
        self.tell_nodes(set, &must, &replicas).await
    }

    /// A move's target: starts the volume's redo replica here (its stream comes from the log
    /// or a copy). A node that held one before forgets what is left of it first, as for a
    /// chunk ([`ClusterNode::start_replica`]).
    pub(crate) async fn start_redo(&self, volume: u32) -> Result<Answer, Refusal> {
        let group = tundra_raft::redo_machine::redo_group(volume);
        if self.host.raft(group).is_ok() {
            return Ok(Answer::Done);
        }
        let def = self.def_of(volume)?;
        if self.host.has_log_of(group) {
            self.forget_redo(&def).await.map_err(Refusal::Unavailable)?;
        }
        self.open_redo_group(&def).await.map_err(Refusal::Unavailable)?;
        Ok(Answer::Done)
    }

    /// Stops this node's redo replica of the volume and forgets it ([`ClusterNode::forget_redo`]).
    pub(crate) async fn drop_redo(&self, volume: u32) -> Result<Answer, Refusal> {
        let group = tundra_raft::redo_machine::redo_group(volume);
        if self.host.raft(group).is_err() {
            return Ok(Answer::Done);
        }
        let def = self.def_of(volume)?;
        self.forget_redo(&def).await.map_err(Refusal::Unavailable)?;
        Ok(Answer::Done)
    }

    /// Stops this node's redo replica of the volume if it runs, forgets its log (the vote
    /// stays), then drops its stream and mark and frees the volume's images of the chunks this
    /// node runs no group of (its folds wrote them). The log goes first (tundra-raft's
    /// `Host::drop_redo_group` says why).
    async fn forget_redo(&self, def: &VolumeDef) -> Result<(), String> {
        let volume = def.id;
        self.host.drop_redo_group(tundra_raft::redo_machine::redo_group(volume)).await?;
        let me = self.me;
        let node = self.node.clone();
        tokio::task::block_in_place(|| -> Result<(), String> {
            node.drop_redo_stream(VolumeId(volume)).map_err(|e| e.to_string())?;
            let _ = std::fs::remove_file(crate::redo::mark_file(node.data_dir(), volume));
            let v = node.volume(VolumeId(volume)).map_err(|e| e.to_string())?;
            let empty = tundra_raft::mark::ApplyMark::default().encode();
            for chunk in crate::cluster::chunks(&v.volume).filter(|c| !def.runs(me, c.index())) {
                v.pages().store().replace_chunk(chunk, &[], &empty).map_err(|e| e.to_string())?;
            }
            Ok(())
        })
    }

    /// A membership change of a volume's redo group, here as its leader.
    pub(crate) async fn change_redo_membership(
        &self,
        volume: u32,
        change: MembershipChange,
    ) -> Result<Answer, Refusal> {
        self.change_group_membership(tundra_raft::redo_machine::redo_group(volume), change).await
    }
}
