//! Migration plans: which chunk replicas to move, from where, to where (seed 000 §4.2).
//!
//! [`ClusterState::plan`] is a query: it reads the state and returns a [`Plan`], a list of
//! [`Move`]s, without changing anything. Whoever executes the plan turns each move into a
//! `BeginMove` command (every member checks it again), copies the chunk, and ends it with
//! `FinishMove` or `AbortMove`. Moves come in order of urgency: copies lost with a dead node,
//! then a draining node's chunks, then the logical rule (nodes above the average, new nodes
//! below it), then, under the compression-aware policy, the zones (`rules.rs`). Every plan
//! keeps one membership change per chunk (a chunk moving already, or moved earlier in the plan,
//! is left alone) and the throttle (moves in flight count against it). The balancing moves
//! obey `potential.rs`, which is why repeated plans converge.

mod potential;
mod rules;

use std::collections::{BTreeMap, BTreeSet};

use tundra_store::ids::ChunkId;

pub use potential::{Measure, Measures, Thresholds};
#[doc(hidden)]
pub use rules::set_zone_takes_for_test;

use crate::state::{ClusterState, NodeStatus};
use crate::usage::{NodeId, Space};

/// Why a move was planned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub enum MoveReason {
    /// The source is dead: the chunk is copied again from its other replicas.
    Repair,
    /// The source is draining.
    Drain,
    /// The source's logical usage is more than the margin above the average.
    LogicalOver,
    /// The target's logical usage is more than the margin below the average (a new node).
    LogicalUnder,
    /// For a node in zone A: one of its lowest-ratio chunks leaves (§4.2.2), or, when it cannot
    /// send without falling under the logical margin, a high-ratio chunk comes to it
    /// (rules.rs's `zone_moves`).
    ZoneA,
    /// For a node in zone D: one of its highest-ratio chunks leaves (§4.2.2), or a low-ratio
    /// chunk comes to it.
    ZoneD,
}

impl MoveReason {
    pub fn name(self) -> &'static str {
        match self {
            MoveReason::Repair => "repair",
            MoveReason::Drain => "drain",
            MoveReason::LogicalOver => "logical-over",
            MoveReason::LogicalUnder => "logical-under",
            MoveReason::ZoneA => "zone-a",
            MoveReason::ZoneD => "zone-d",
        }
    }
}

/// One chunk replica moving from one node to another: one membership change of the chunk's
/// group (learner added on `to`, caught up, made a voter, `from` removed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Move {
    #[serde(with = "crate::codec::chunk_id")]
    pub chunk: ChunkId,
    pub from: NodeId,
    pub to: NodeId,
    pub reason: MoveReason,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub moves: Vec<Move>,
}

impl ClusterState {
    /// The moves to start now, within the throttle.
    pub fn plan(&self) -> Plan {
        self.plan_excluding(&BTreeSet::new())
    }

    /// [`ClusterState::plan`] with no move of a chunk to a node in `excluded` (chunk, target):
    /// moves that were tried and refused (a target whose volume clashes), so that the
    /// plan goes around them rather than stalling on them. Excluding only removes candidate
    /// moves, so the convergence argument (potential.rs) holds as it is.
    pub fn plan_excluding(&self, excluded: &BTreeSet<(ChunkId, NodeId)>) -> Plan {
        let mut planner = Planner::new(self, excluded);
        planner.evacuate(NodeStatus::Dead, MoveReason::Repair);
        planner.evacuate(NodeStatus::Draining, MoveReason::Drain);
        planner.logical_over();
        planner.logical_under();
        if self.config.policy == crate::config::Policy::CompressionAware {
            planner.zone_moves();
        }
        Plan { moves: planner.moves }
    }

    /// The thresholds plans compare against, from the active nodes' projected usage.
    pub fn thresholds(&self) -> Thresholds {
        let (used, capacity) = self
            .nodes
            .values()
            .filter(|n| n.takes_part())
            .fold((Space::ZERO, Space::ZERO), |(u, c), n| (u.plus(n.projected()), c.plus(n.capacity)));
        Thresholds::new(&self.config, used, capacity)
    }
}

/// A plan being built: the state as the moves planned so far would leave it.
pub(crate) struct Planner<'a> {
    state: &'a ClusterState,
    /// Moves (chunk, target) not to plan ([`ClusterState::plan_excluding`]).
    excluded: &'a BTreeSet<(ChunkId, NodeId)>,
    thresholds: Thresholds,
    /// Projected usage of the nodes the plan changed.
    used: BTreeMap<NodeId, Space>,
    /// Chunks moving already or moved in this plan.
    busy: BTreeSet<ChunkId>,
    /// Chunks each node gained or lost in this plan.
    gained: BTreeMap<NodeId, BTreeSet<ChunkId>>,
    lost: BTreeMap<NodeId, BTreeSet<ChunkId>>,
    /// Moves in flight or planned, per node and in all.
    node_moves: BTreeMap<NodeId, usize>,
    total_moves: usize,
    moves: Vec<Move>,
}

impl<'a> Planner<'a> {
    fn new(state: &'a ClusterState, excluded: &'a BTreeSet<(ChunkId, NodeId)>) -> Planner<'a> {
        let mut node_moves = BTreeMap::new();
        let mut total_moves = 0;
        for m in state.moves_in_flight() {
            *node_moves.entry(m.from).or_insert(0) += 1;
            *node_moves.entry(m.to).or_insert(0) += 1;
            total_moves += 1;
        }
        Planner {
            state,
            excluded,
            thresholds: state.thresholds(),
            used: BTreeMap::new(),
            busy: state.moving.clone(),
            gained: BTreeMap::new(),
            lost: BTreeMap::new(),
            node_moves,
            total_moves,
            moves: Vec::new(),
        }
    }

    fn used(&self, node: NodeId) -> Space {
        self.used.get(&node).copied().unwrap_or_else(|| self.state.nodes[&node].projected())
    }

    fn capacity(&self, node: NodeId) -> Space {
        self.state.nodes[&node].capacity
    }

    fn measures(&self, node: NodeId) -> Measures {
        self.thresholds.measures(self.used(node), self.capacity(node))
    }

    fn logical_fraction(&self, node: NodeId) -> f64 {
        self.used(node).fractions_of(self.capacity(node)).0
    }

    fn ratio(&self, node: NodeId) -> Option<f64> {
        self.used(node).ratio()
    }

    fn full(&self) -> bool {
        self.total_moves >= self.state.config.throttle.max_moves
    }

    /// Whether `node` may take part in one more move. A dead source sends nothing itself (the
    /// copy comes from the other replicas), so it is not limited.
    fn node_free(&self, node: NodeId) -> bool {
        self.state.nodes[&node].status == NodeStatus::Dead
            || self.node_moves.get(&node).copied().unwrap_or(0) < self.state.config.throttle.max_moves_per_node
    }

    /// Whether `node` hosts `chunk` as the plan would leave it.
    fn hosts(&self, node: NodeId, chunk: ChunkId) -> bool {
        let gained = self.gained.get(&node).is_some_and(|g| g.contains(&chunk));
        let lost = self.lost.get(&node).is_some_and(|l| l.contains(&chunk));
        gained || (self.state.nodes[&node].chunks.contains(&chunk) && !lost)
    }

    /// Whether `chunk` may move to `to`: an active node with room under the fullness limit that
    /// has no replica of it, and a move left in its throttle.
    fn may_receive(&self, to: NodeId, chunk: ChunkId, size: Space) -> bool {
        let node = &self.state.nodes[&to];
        if !node.takes_part() || !self.node_free(to) || self.hosts(to, chunk) || self.excluded.contains(&(chunk, to)) {
            return false;
        }
        let (logical, physical) = self.used(to).plus(size).fractions_of(node.capacity);
        logical <= self.state.config.fullness_limit && physical <= self.state.config.fullness_limit
    }

    /// Whether moving `size` from `from` to `to` improves `purpose` without worsening any
    /// measure (potential.rs).
    fn improves(&self, from: NodeId, to: NodeId, size: Space, purpose: Measure) -> bool {
        let before = self.measures(from).plus(self.measures(to));
        let after_from = self.thresholds.measures(self.used(from).minus(size), self.capacity(from));
        let after_to = self.thresholds.measures(self.used(to).plus(size), self.capacity(to));
        before.improved_by(after_from.plus(after_to), purpose)
    }

    fn add(&mut self, chunk: ChunkId, from: NodeId, to: NodeId, reason: MoveReason) {
        let size = self.state.chunks[&chunk].size;
        debug_assert!(!self.busy.contains(&chunk));
        let from_used = self.used(from).minus(size);
        let to_used = self.used(to).plus(size);
        self.used.insert(from, from_used);
        self.used.insert(to, to_used);
        self.busy.insert(chunk);
        self.lost.entry(from).or_default().insert(chunk);
        self.gained.entry(to).or_default().insert(chunk);
        *self.node_moves.entry(from).or_insert(0) += 1;
        *self.node_moves.entry(to).or_insert(0) += 1;
        self.total_moves += 1;
        self.moves.push(Move { chunk, from, to, reason });
    }

    /// The chunks on `node` that may move now, as the state has them (a chunk gained in this
    /// plan is busy).
    fn movable(&self, node: NodeId) -> impl Iterator<Item = (ChunkId, Space)> + '_ {
        self.state.nodes[&node]
            .chunks
            .iter()
            .filter(|c| !self.busy.contains(c))
            .map(|c| (*c, self.state.chunks[c].size))
    }

    /// Active nodes whose reports are known, in id order.
    fn active(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.state.nodes.iter().filter(|(_, n)| n.takes_part()).map(|(id, _)| *id)
    }
}
