//! `ClusterState`, the manager's state: the nodes (capacity, status, usage, the chunks they
//! host) and the chunks (size, replicas, the move under way), changed only by
//! [`Command`]s through [`ClusterState::apply`].
//!
//! The state is built to be a Raft state machine: `apply` is a pure function of the state and
//! the command (ordered maps, integer byte counts, no clock, no random source), and a refused
//! command changes nothing, so every member that applies the same log holds the same state and
//! takes the same decisions. Placement is a command (the replicas are chosen inside `apply`);
//! migration plans are queries ([`ClusterState::plan`]) whose moves become `BeginMove`
//! commands that every member checks again.
//!
//! A node's usage is projected: a chunk counts on the nodes it is placed on or moving to and no
//! longer on a node it is moving from, so that decisions see the cluster as it will be once the
//! moves in flight finish. A heartbeat's usage beyond what the chunks account for (the store's
//! own metadata, space not yet trimmed) is kept as the node's overhead and added to the
//! projection.

use std::collections::{BTreeMap, BTreeSet};

use tundra_store::ids::ChunkId;

use crate::config::ManagerConfig;
use crate::error::{Error, Result};
use crate::mover::{CLAIM_LEASE_MAX_MS, MoveClaim, MoveOwner, RoundRecord};
use crate::plan::Move;
use crate::usage::{NodeId, Space};

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum NodeStatus {
    /// Takes new replicas and moves.
    Active,
    /// Being emptied before it is retired: takes nothing, every chunk moves off it.
    Draining,
    /// Lost: takes nothing, and each of its chunks is copied again from its other replicas.
    Dead,
}

#[derive(Clone, Debug, PartialEq)]
pub struct NodeState {
    pub status: NodeStatus,
    pub capacity: Space,
    /// The chunks placed on the node or moving to it, not those moving off it.
    pub chunks: BTreeSet<ChunkId>,
    /// The sizes of `chunks`.
    pub chunk_space: Space,
    /// Usage the last heartbeat reported beyond what the chunks on the node account for.
    pub overhead: Space,
    /// Sizes of the chunks moving to the node, and moving off it.
    pub incoming: Space,
    pub outgoing: Space,
    /// The usage its last `Report` gave, and when the leader wrote it (none: no `Report` yet,
    /// only a `Heartbeat`, which carries no time).
    pub reported_used: Option<Space>,
    pub reported_unix_ms: Option<u64>,
    /// The node lets volumes promise more than its drive holds (`[drive] overcommit`).
    pub overcommit: bool,
    /// Not replicated: set on a copy of the state by [`ClusterState::mark_unknown`] for a node
    /// whose report is stale, which then neither gives nor takes chunks in a plan and counts
    /// in no average. Always false in the replicated state.
    pub unknown: bool,
}

impl NodeState {
    /// Usage once the moves in flight finish: the decisions' view.
    pub fn projected(&self) -> Space {
        self.chunk_space.plus(self.overhead)
    }

    /// Usage as the node has it now (moving chunks still on their source).
    pub fn actual_chunk_space(&self) -> Space {
        self.chunk_space.minus(self.incoming).plus(self.outgoing)
    }

    /// Whether the node takes part in decisions: active, and its report not stale.
    pub fn takes_part(&self) -> bool {
        self.status == NodeStatus::Active && !self.unknown
    }

    /// An empty node of `status` and `capacity`.
    pub(crate) fn empty(status: NodeStatus, capacity: Space) -> NodeState {
        NodeState {
            status,
            capacity,
            chunks: BTreeSet::new(),
            chunk_space: Space::ZERO,
            overhead: Space::ZERO,
            incoming: Space::ZERO,
            outgoing: Space::ZERO,
            reported_used: None,
            reported_unix_ms: None,
            overcommit: false,
            unknown: false,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ChunkState {
    /// The size the decisions count: what the chunk's stats report, but never less than the
    /// size placement expected for it (a chunk is a fixed range of a volume that fills over
    /// time, and counting only what it holds so far would let nodes fill past their share).
    /// Below the expected logical bytes, the physical bytes follow the reported ratio, or the
    /// cluster's average ratio at placement while nothing is reported.
    pub size: Space,
    /// The placement's expectation.
    pub expected: Space,
    /// What the chunk's last stats reported; `None` until a report arrives.
    pub reported: Option<Space>,
    /// The nodes it will be on once its move (if any) finishes.
    pub replicas: BTreeSet<NodeId>,
    /// The one membership change under way.
    pub moving: Option<Move>,
}

/// What the manager is told and asked to do. Every member applies the same sequence. Its bytes
/// (a version byte, then postcard) are `crate::codec`'s.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Command {
    Configure(ManagerConfig),
    /// A node joins, empty.
    AddNode {
        node: NodeId,
        capacity: Space,
    },
    /// A node's drives report their capacity and usage.
    Heartbeat {
        node: NodeId,
        capacity: Space,
        used: Space,
    },
    /// A chunk's leader reports the chunk's logical and physical bytes.
    ChunkStats {
        #[serde(with = "crate::codec::chunk_id")]
        chunk: ChunkId,
        size: Space,
    },
    /// Place a new chunk: the manager chooses its replicas. `expected_logical_bytes` counts
    /// against the chosen nodes until the chunk's stats arrive (a new chunk is empty, and
    /// counting it as nothing would send a burst of new chunks to the same few nodes).
    PlaceChunk {
        #[serde(with = "crate::codec::chunk_id")]
        chunk: ChunkId,
        expected_logical_bytes: u64,
    },
    DeleteChunk {
        #[serde(with = "crate::codec::chunk_id")]
        chunk: ChunkId,
    },
    /// An existing chunk whose replicas are known (a manager rebuilt from the nodes' catalogs):
    /// it counts against its nodes at the size a placement would have expected, until its
    /// stats arrive. Apply before the nodes' heartbeats, so that their usage beyond the
    /// chunks is counted once.
    AdoptChunk {
        #[serde(with = "crate::codec::chunk_id")]
        chunk: ChunkId,
        replicas: BTreeSet<NodeId>,
        expected_logical_bytes: u64,
    },
    /// `tundra cluster drain`: move everything off the node.
    DrainNode {
        node: NodeId,
    },
    /// The node is lost; moves into it are given up.
    NodeDead {
        node: NodeId,
    },
    /// Forget a node that hosts nothing.
    RemoveNode {
        node: NodeId,
    },
    /// A migration starts (learner added on `to`).
    BeginMove(Move),
    /// The migration finished: `to` is a voter, `from` is removed.
    FinishMove {
        #[serde(with = "crate::codec::chunk_id")]
        chunk: ChunkId,
    },
    /// The migration was rolled back: `to` is removed, `from` stays.
    AbortMove {
        #[serde(with = "crate::codec::chunk_id")]
        chunk: ChunkId,
    },
    /// `node`'s periodic report: the logical and physical bytes of chunks whose groups it
    /// leads, measured on its replica (seed 000 §4.2.2: the per-chunk ratios the scheduler
    /// reads), at most [`MAX_SIZES_PER_COMMAND`], each chunk once. `node` must hold a replica
    /// of each and not be the target of its move in flight (a learner still catching up holds
    /// part of the chunk). Refused whole if any entry is. Added after the other variants, so
    /// that their encodings are unchanged.
    ChunkSizes {
        node: NodeId,
        sizes: Vec<ReportedSize>,
    },
    /// Version 3. A node's report as the manager's leader wrote it at `at_unix_ms` (its wall
    /// clock): a `Heartbeat` whose usage and time the state keeps, so that a node silent for
    /// longer than [`crate::mover::REPORT_STALE_AFTER_MS`] is unknown to the decisions, and the
    /// node's thin provisioning (`overcommit`).
    Report {
        node: NodeId,
        capacity: Space,
        used: Space,
        overcommit: bool,
        at_unix_ms: u64,
    },
    /// Version 3. `PlaceChunk` at the leader's time `at_unix_ms`: a node whose report is stale
    /// then takes no replica.
    PlaceChunkAt {
        #[serde(with = "crate::codec::chunk_id")]
        chunk: ChunkId,
        expected_logical_bytes: u64,
        at_unix_ms: u64,
    },
    /// Version 3. Take or renew the claim on moves until `at_unix_ms + lease_ms`; refused while
    /// another owner's claim holds at `at_unix_ms`.
    Claim {
        owner: MoveOwner,
        at_unix_ms: u64,
        lease_ms: u64,
    },
    /// Version 3. Give the claim back (nothing happens when `owner` does not hold it).
    Release {
        owner: MoveOwner,
    },
    /// Version 3. What the background rebalancer's last round did.
    RecordRound(RoundRecord),
    /// Version 4. A placed chunk's expected logical bytes become at least
    /// `expected_logical_bytes`: the last chunk of a volume grown within it
    /// (`tundra volume resize`), so that placement and planning count it at its new span. A
    /// figure at or below the chunk's expectation changes nothing (a resize run again).
    GrowChunk {
        #[serde(with = "crate::codec::chunk_id")]
        chunk: ChunkId,
        expected_logical_bytes: u64,
    },
}

/// One chunk's size in a [`Command::ChunkSizes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReportedSize {
    #[serde(with = "crate::codec::chunk_id")]
    pub chunk: ChunkId,
    pub size: Space,
}

/// The most sizes one [`Command::ChunkSizes`] carries: a node with more chunks to report sends
/// the rest in its next reports, so that one command stays a few tens of KiB.
pub const MAX_SIZES_PER_COMMAND: usize = 1024;

/// The largest byte figure a command or a snapshot may carry (1 PiB, far past any drive or
/// chunk): a command past it is refused, so no figure the state adds can overflow.
pub const MAX_FIGURE_BYTES: u64 = 1 << 50;

impl Command {
    /// Refuses a command whose byte figures pass [`MAX_FIGURE_BYTES`].
    pub fn check_figures(&self) -> Result<()> {
        let spaces: Vec<Space> = match self {
            Command::AddNode { capacity, .. } => vec![*capacity],
            Command::Heartbeat { capacity, used, .. } => vec![*capacity, *used],
            Command::ChunkStats { size, .. } => vec![*size],
            Command::ChunkSizes { sizes, .. } => {
                if sizes.len() > MAX_SIZES_PER_COMMAND {
                    return Err(Error::invalid(format!(
                        "{} chunk sizes in one command, past {MAX_SIZES_PER_COMMAND}",
                        sizes.len()
                    )));
                }
                sizes.iter().map(|s| s.size).collect()
            }
            Command::PlaceChunk { expected_logical_bytes, .. }
            | Command::PlaceChunkAt { expected_logical_bytes, .. }
            | Command::AdoptChunk { expected_logical_bytes, .. }
            | Command::GrowChunk { expected_logical_bytes, .. } => vec![Space::new(*expected_logical_bytes, 0)],
            Command::Report { capacity, used, .. } => vec![*capacity, *used],
            Command::Claim { lease_ms, .. } => {
                if *lease_ms == 0 || *lease_ms > CLAIM_LEASE_MAX_MS {
                    return Err(Error::invalid(format!(
                        "a claim's lease of {lease_ms} ms (between 1 and {CLAIM_LEASE_MAX_MS})"
                    )));
                }
                Vec::new()
            }
            Command::RecordRound(record) => {
                record.check()?;
                Vec::new()
            }
            _ => Vec::new(),
        };
        check_spaces(&spaces)
    }
}

/// Refuses figures past [`MAX_FIGURE_BYTES`].
pub(crate) fn check_spaces(spaces: &[Space]) -> Result<()> {
    match spaces.iter().find(|s| s.logical_bytes > MAX_FIGURE_BYTES || s.physical_bytes > MAX_FIGURE_BYTES) {
        Some(s) => Err(Error::invalid(format!(
            "{} logical and {} physical bytes: past the largest figure the manager counts ({MAX_FIGURE_BYTES})",
            s.logical_bytes, s.physical_bytes
        ))),
        None => Ok(()),
    }
}

/// What an applied command answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    Done,
    /// The replicas chosen for a new chunk, in the order chosen.
    Placed(Vec<NodeId>),
}

/// The size a chunk counts at (see `ChunkState::size`).
pub(crate) fn counted_size(expected: Space, reported: Space) -> Space {
    if reported.logical_bytes >= expected.logical_bytes {
        reported
    } else if reported.physical_bytes > 0 && reported.logical_bytes > 0 {
        let physical =
            expected.logical_bytes as u128 * reported.physical_bytes as u128 / reported.logical_bytes as u128;
        Space::new(expected.logical_bytes, u64::try_from(physical).unwrap_or(MAX_FIGURE_BYTES).min(MAX_FIGURE_BYTES))
    } else {
        expected
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ClusterState {
    pub(crate) config: ManagerConfig,
    pub(crate) nodes: BTreeMap<NodeId, NodeState>,
    pub(crate) chunks: BTreeMap<ChunkId, ChunkState>,
    /// Chunks with a move under way, to find them without scanning every chunk.
    pub(crate) moving: BTreeSet<ChunkId>,
    /// The sum of every chunk's size once (not per replica), for the average ratio.
    pub(crate) chunk_total: Space,
    /// Who holds the claim on moves, if anyone did last (it may have lapsed).
    pub(crate) claim: Option<MoveClaim>,
    /// The background rebalancer's last recorded round.
    pub(crate) last_round: Option<RoundRecord>,
}

impl ClusterState {
    pub fn new(config: ManagerConfig) -> Result<ClusterState> {
        config.validate()?;
        Ok(ClusterState {
            config,
            nodes: BTreeMap::new(),
            chunks: BTreeMap::new(),
            moving: BTreeSet::new(),
            chunk_total: Space::ZERO,
            claim: None,
            last_round: None,
        })
    }

    pub fn config(&self) -> &ManagerConfig {
        &self.config
    }
    pub fn nodes(&self) -> &BTreeMap<NodeId, NodeState> {
        &self.nodes
    }
    pub fn node(&self, node: NodeId) -> Option<&NodeState> {
        self.nodes.get(&node)
    }
    pub fn chunks(&self) -> &BTreeMap<ChunkId, ChunkState> {
        &self.chunks
    }
    pub fn chunk(&self, chunk: ChunkId) -> Option<&ChunkState> {
        self.chunks.get(&chunk)
    }
    /// The last claim on moves taken (check [`MoveClaim::holds_at`]: it may have lapsed).
    pub fn claim(&self) -> Option<&MoveClaim> {
        self.claim.as_ref()
    }
    pub fn last_round(&self) -> Option<&RoundRecord> {
        self.last_round.as_ref()
    }

    /// Marks every active node whose report is stale at `now_unix_ms` unknown (on a copy of the
    /// replicated state, for one decision): it then neither gives nor takes chunks in a plan
    /// and counts in no average. Answers the nodes marked.
    pub fn mark_unknown(&mut self, now_unix_ms: u64) -> Vec<NodeId> {
        let stale = crate::mover::stale_nodes(&self.nodes, now_unix_ms);
        let mut marked = Vec::new();
        for id in stale {
            let node = self.nodes.get_mut(&id).expect("a node of the state");
            if node.status == NodeStatus::Active {
                node.unknown = true;
                marked.push(id);
            }
        }
        marked
    }

    /// The moves under way, in chunk order.
    pub fn moves_in_flight(&self) -> impl Iterator<Item = &Move> {
        self.moving.iter().filter_map(|c| self.chunks[c].moving.as_ref())
    }

    /// Applies one command. A refused command changes nothing.
    pub fn apply(&mut self, command: &Command) -> Result<Applied> {
        command.check_figures()?;
        match command {
            Command::Configure(config) => {
                config.validate()?;
                self.config = *config;
            }
            Command::AddNode { node, capacity } => self.add_node(*node, *capacity)?,
            Command::Heartbeat { node, capacity, used } => self.heartbeat(*node, *capacity, *used)?,
            Command::ChunkStats { chunk, size } => self.chunk_stats(*chunk, *size)?,
            Command::ChunkSizes { node, sizes } => self.chunk_sizes(*node, sizes)?,
            Command::PlaceChunk { chunk, expected_logical_bytes } => {
                return self.place_chunk_at(*chunk, *expected_logical_bytes, None).map(Applied::Placed);
            }
            Command::DeleteChunk { chunk } => self.delete_chunk(*chunk)?,
            Command::AdoptChunk { chunk, replicas, expected_logical_bytes } => {
                self.adopt_chunk(*chunk, replicas, *expected_logical_bytes)?
            }
            Command::DrainNode { node } => self.set_status(*node, NodeStatus::Draining)?,
            Command::NodeDead { node } => self.node_dead(*node)?,
            Command::RemoveNode { node } => self.remove_node(*node)?,
            Command::BeginMove(planned) => self.begin_move(planned)?,
            Command::FinishMove { chunk } => self.finish_move(*chunk)?,
            Command::AbortMove { chunk } => self.abort_move(*chunk)?,
            Command::Report { node, capacity, used, overcommit, at_unix_ms } => {
                self.heartbeat(*node, *capacity, *used)?;
                let n = self.nodes.get_mut(node).expect("the heartbeat found it");
                n.reported_used = Some(*used);
                n.reported_unix_ms = Some(*at_unix_ms);
                n.overcommit = *overcommit;
            }
            Command::PlaceChunkAt { chunk, expected_logical_bytes, at_unix_ms } => {
                return self.place_chunk_at(*chunk, *expected_logical_bytes, Some(*at_unix_ms)).map(Applied::Placed);
            }
            Command::Claim { owner, at_unix_ms, lease_ms } => self.take_claim(*owner, *at_unix_ms, *lease_ms)?,
            Command::Release { owner } => {
                if self.claim.is_some_and(|c| c.owner == *owner) {
                    self.claim = None;
                }
            }
            Command::RecordRound(record) => self.last_round = Some(record.clone()),
            Command::GrowChunk { chunk, expected_logical_bytes } => self.grow_chunk(*chunk, *expected_logical_bytes)?,
        }
        Ok(Applied::Done)
    }

    fn node_mut(&mut self, node: NodeId) -> Result<&mut NodeState> {
        self.nodes.get_mut(&node).ok_or_else(|| Error::invalid(format!("unknown {node}")))
    }

    fn chunk_ref(&self, chunk: ChunkId) -> Result<&ChunkState> {
        self.chunks.get(&chunk).ok_or_else(|| Error::invalid(format!("unknown chunk {}", chunk.0)))
    }

    fn add_node(&mut self, node: NodeId, capacity: Space) -> Result<()> {
        if self.nodes.contains_key(&node) {
            return Err(Error::invalid(format!("{node} is already a member")));
        }
        if capacity.logical_bytes == 0 || capacity.physical_bytes == 0 {
            return Err(Error::invalid(format!("{node} reports a zero capacity")));
        }
        self.nodes.insert(node, NodeState::empty(NodeStatus::Active, capacity));
        Ok(())
    }

    fn heartbeat(&mut self, node: NodeId, capacity: Space, used: Space) -> Result<()> {
        if capacity.logical_bytes == 0 || capacity.physical_bytes == 0 {
            return Err(Error::invalid(format!("{node} reports a zero capacity")));
        }
        let state = self.node_mut(node)?;
        state.capacity = capacity;
        state.overhead = used.saturating_minus(state.actual_chunk_space());
        Ok(())
    }

    fn chunk_stats(&mut self, chunk: ChunkId, reported: Space) -> Result<()> {
        let size = counted_size(self.chunk_ref(chunk)?.expected, reported);
        self.recount(chunk, size)?.reported = Some(reported);
        Ok(())
    }

    /// Counts `chunk` at `size` from now on, in place of its old size, wherever it is counted:
    /// its replicas' chunk space, a move in flight's incoming and outgoing, the total. Answers
    /// the chunk's state, its size set.
    fn recount(&mut self, chunk: ChunkId, size: Space) -> Result<&mut ChunkState> {
        let state = self.chunk_ref(chunk)?;
        let old = state.size;
        let replicas: Vec<NodeId> = state.replicas.iter().copied().collect();
        let moving = state.moving;
        for node in replicas {
            let n = self.nodes.get_mut(&node).expect("a replica's node is a member");
            n.chunk_space = n.chunk_space.minus(old).plus(size);
        }
        if let Some(m) = moving {
            let to = self.nodes.get_mut(&m.to).expect("a move's target is a member");
            to.incoming = to.incoming.minus(old).plus(size);
            let from = self.nodes.get_mut(&m.from).expect("a move's source is a member");
            from.outgoing = from.outgoing.minus(old).plus(size);
        }
        self.chunk_total = self.chunk_total.minus(old).plus(size);
        let state = self.chunks.get_mut(&chunk).expect("checked above");
        state.size = size;
        Ok(state)
    }

    /// A node's report of the chunks it leads: every entry checked before any is applied.
    fn chunk_sizes(&mut self, node: NodeId, sizes: &[ReportedSize]) -> Result<()> {
        let mut seen = BTreeSet::new();
        for s in sizes {
            let chunk = self.chunk_ref(s.chunk)?;
            if !seen.insert(s.chunk) {
                return Err(Error::invalid(format!("chunk {} reported twice in one command", s.chunk.0)));
            }
            if !chunk.replicas.contains(&node) {
                return Err(Error::invalid(format!(
                    "{node} reports chunk {}, of which it holds no replica",
                    s.chunk.0
                )));
            }
            if chunk.moving.is_some_and(|m| m.to == node) {
                return Err(Error::invalid(format!(
                    "{node} reports chunk {} while it is still moving there",
                    s.chunk.0
                )));
            }
        }
        for s in sizes {
            self.chunk_stats(s.chunk, s.size).expect("every entry checked above");
        }
        Ok(())
    }

    /// Places a chunk; at `at_unix_ms` (a `PlaceChunkAt`), nodes whose reports are stale then
    /// take no replica.
    fn place_chunk_at(
        &mut self,
        chunk: ChunkId,
        expected_logical_bytes: u64,
        at_unix_ms: Option<u64>,
    ) -> Result<Vec<NodeId>> {
        if self.chunks.contains_key(&chunk) {
            return Err(Error::invalid(format!("chunk {} is already placed", chunk.0)));
        }
        let size = self.expected_size(expected_logical_bytes);
        let stale = at_unix_ms.map(|now| crate::mover::stale_nodes(&self.nodes, now)).unwrap_or_default();
        let chosen = self.choose_replicas_except(size, &stale)?;
        for &node in &chosen {
            let n = self.nodes.get_mut(&node).expect("chosen among members");
            n.chunks.insert(chunk);
            n.chunk_space = n.chunk_space.plus(size);
        }
        self.chunk_total = self.chunk_total.plus(size);
        let replicas = chosen.iter().copied().collect();
        self.chunks.insert(chunk, ChunkState { size, expected: size, reported: None, replicas, moving: None });
        Ok(chosen)
    }

    fn adopt_chunk(&mut self, chunk: ChunkId, replicas: &BTreeSet<NodeId>, expected_logical_bytes: u64) -> Result<()> {
        if self.chunks.contains_key(&chunk) {
            return Err(Error::invalid(format!("chunk {} is already placed", chunk.0)));
        }
        if replicas.is_empty() {
            return Err(Error::invalid(format!("chunk {} has no replica", chunk.0)));
        }
        if let Some(unknown) = replicas.iter().find(|node| !self.nodes.contains_key(node)) {
            return Err(Error::invalid(format!("chunk {} is on {unknown}, which is not a member", chunk.0)));
        }
        let size = self.expected_size(expected_logical_bytes);
        for node in replicas {
            let n = self.nodes.get_mut(node).expect("checked above");
            n.chunks.insert(chunk);
            n.chunk_space = n.chunk_space.plus(size);
        }
        self.chunk_total = self.chunk_total.plus(size);
        let state = ChunkState { size, expected: size, reported: None, replicas: replicas.clone(), moving: None };
        self.chunks.insert(chunk, state);
        Ok(())
    }

    /// A grown chunk's expectation (`GrowChunk`): the chunk counts at the larger of the new
    /// expectation and what it reported, on its replicas and in a move in flight, as a
    /// report's new size would.
    fn grow_chunk(&mut self, chunk: ChunkId, expected_logical_bytes: u64) -> Result<()> {
        let state = self.chunk_ref(chunk)?;
        if expected_logical_bytes <= state.expected.logical_bytes {
            return Ok(());
        }
        let expected = self.expected_size(expected_logical_bytes);
        let size = state.reported.map_or(expected, |reported| counted_size(expected, reported));
        self.recount(chunk, size)?.expected = expected;
        Ok(())
    }

    /// A new chunk's size until its stats arrive: the expected logical bytes, and physical bytes
    /// at the cluster's average ratio (uncompressed while nothing is stored yet).
    pub fn expected_size(&self, logical_bytes: u64) -> Space {
        let physical_bytes = match self.chunk_total.ratio() {
            Some(ratio) if ratio > 0.0 => (logical_bytes as f64 / ratio).ceil() as u64,
            _ => logical_bytes,
        };
        Space::new(logical_bytes, physical_bytes)
    }

    fn delete_chunk(&mut self, chunk: ChunkId) -> Result<()> {
        let state = self.chunk_ref(chunk)?;
        if state.moving.is_some() {
            return Err(Error::conflict(format!("chunk {} is moving; finish or abort the move first", chunk.0)));
        }
        let state = self.chunks.remove(&chunk).expect("checked above");
        for node in &state.replicas {
            let n = self.nodes.get_mut(node).expect("a replica's node is a member");
            n.chunks.remove(&chunk);
            n.chunk_space = n.chunk_space.minus(state.size);
        }
        self.chunk_total = self.chunk_total.minus(state.size);
        Ok(())
    }

    fn set_status(&mut self, node: NodeId, status: NodeStatus) -> Result<()> {
        let n = self.node_mut(node)?;
        if n.status == NodeStatus::Dead {
            return Err(Error::invalid(format!("{node} is dead")));
        }
        n.status = status;
        Ok(())
    }

    fn node_dead(&mut self, node: NodeId) -> Result<()> {
        self.node_mut(node)?.status = NodeStatus::Dead;
        let into_dead: Vec<ChunkId> = self.moves_in_flight().filter(|m| m.to == node).map(|m| m.chunk).collect();
        for chunk in into_dead {
            self.abort_move(chunk).expect("a move in flight can be aborted");
        }
        Ok(())
    }

    fn remove_node(&mut self, node: NodeId) -> Result<()> {
        let n = self.nodes.get(&node).ok_or_else(|| Error::invalid(format!("unknown {node}")))?;
        if !n.chunks.is_empty() || n.outgoing != Space::ZERO {
            return Err(Error::conflict(format!(
                "{node} still hosts {} chunks (or sends some); drain it first",
                n.chunks.len()
            )));
        }
        self.nodes.remove(&node);
        Ok(())
    }

    fn begin_move(&mut self, planned: &Move) -> Result<()> {
        let chunk = self.chunk_ref(planned.chunk)?;
        if let Some(current) = &chunk.moving {
            return Err(Error::conflict(format!(
                "chunk {} is already moving from {} to {}",
                planned.chunk.0, current.from, current.to
            )));
        }
        if !chunk.replicas.contains(&planned.from) {
            return Err(Error::invalid(format!("chunk {} has no replica on {}", planned.chunk.0, planned.from)));
        }
        if chunk.replicas.contains(&planned.to) {
            return Err(Error::invalid(format!("chunk {} already has a replica on {}", planned.chunk.0, planned.to)));
        }
        let size = chunk.size;
        let target = self.nodes.get(&planned.to).ok_or_else(|| Error::invalid(format!("unknown {}", planned.to)))?;
        if !target.takes_part() {
            return Err(Error::invalid(format!("{} takes no chunks ({:?})", planned.to, target.status)));
        }
        if !self.fits(target, size) {
            return Err(Error::full(format!("{} would pass the fullness limit", planned.to)));
        }
        let to = self.nodes.get_mut(&planned.to).expect("checked above");
        to.chunks.insert(planned.chunk);
        to.chunk_space = to.chunk_space.plus(size);
        to.incoming = to.incoming.plus(size);
        let from = self.nodes.get_mut(&planned.from).expect("a replica's node is a member");
        from.chunks.remove(&planned.chunk);
        from.chunk_space = from.chunk_space.minus(size);
        from.outgoing = from.outgoing.plus(size);
        let chunk = self.chunks.get_mut(&planned.chunk).expect("checked above");
        chunk.replicas.remove(&planned.from);
        chunk.replicas.insert(planned.to);
        chunk.moving = Some(*planned);
        self.moving.insert(planned.chunk);
        Ok(())
    }

    /// Whether `size` more keeps a node within the fullness limit on both axes.
    pub(crate) fn fits(&self, node: &NodeState, size: Space) -> bool {
        let (logical, physical) = node.projected().plus(size).fractions_of(node.capacity);
        logical <= self.config.fullness_limit && physical <= self.config.fullness_limit
    }

    fn take_claim(&mut self, owner: MoveOwner, at_unix_ms: u64, lease_ms: u64) -> Result<()> {
        let taken_unix_ms = match self.claim {
            Some(held) if held.owner != owner && held.holds_at(at_unix_ms) => {
                let left_s = (held.until_unix_ms - at_unix_ms).div_ceil(1000);
                return Err(Error::conflict(format!(
                    "{} is making moves (its claim lasts {left_s} s more unless renewed)",
                    held.owner
                )));
            }
            Some(held) if held.owner == owner && held.holds_at(at_unix_ms) => held.taken_unix_ms,
            _ => at_unix_ms,
        };
        let until_unix_ms = at_unix_ms.saturating_add(lease_ms);
        self.claim = Some(MoveClaim { owner, taken_unix_ms, until_unix_ms });
        Ok(())
    }

    fn take_move(&mut self, chunk: ChunkId) -> Result<(Move, Space)> {
        let state = self.chunk_ref(chunk)?;
        let Some(m) = state.moving else {
            return Err(Error::conflict(format!("chunk {} is not moving", chunk.0)));
        };
        let size = state.size;
        self.chunks.get_mut(&chunk).expect("checked above").moving = None;
        self.moving.remove(&chunk);
        let to = self.nodes.get_mut(&m.to).expect("a move's target is a member");
        to.incoming = to.incoming.minus(size);
        let from = self.nodes.get_mut(&m.from).expect("a move's source is a member");
        from.outgoing = from.outgoing.minus(size);
        Ok((m, size))
    }

    fn finish_move(&mut self, chunk: ChunkId) -> Result<()> {
        self.take_move(chunk)?;
        Ok(())
    }

    fn abort_move(&mut self, chunk: ChunkId) -> Result<()> {
        let (m, size) = self.take_move(chunk)?;
        let to = self.nodes.get_mut(&m.to).expect("a move's target is a member");
        to.chunks.remove(&chunk);
        to.chunk_space = to.chunk_space.minus(size);
        let from = self.nodes.get_mut(&m.from).expect("a move's source is a member");
        from.chunks.insert(chunk);
        from.chunk_space = from.chunk_space.plus(size);
        let state = self.chunks.get_mut(&chunk).expect("checked by take_move");
        state.replicas.remove(&m.to);
        state.replicas.insert(m.from);
        Ok(())
    }

    /// Recounts every derived figure from the chunks and compares; panics on a difference.
    /// Run by the tests and the simulator after every step.
    pub fn check_invariants(&self) {
        let mut space: BTreeMap<NodeId, Space> = BTreeMap::new();
        let mut incoming: BTreeMap<NodeId, Space> = BTreeMap::new();
        let mut outgoing: BTreeMap<NodeId, Space> = BTreeMap::new();
        let mut total = Space::ZERO;
        for (id, chunk) in &self.chunks {
            assert!(!chunk.replicas.is_empty(), "chunk {} has no replica", id.0);
            let reported = chunk.reported.unwrap_or(Space::ZERO);
            assert_eq!(chunk.size, counted_size(chunk.expected, reported), "chunk {} counted size", id.0);
            total = total.plus(chunk.size);
            for node in &chunk.replicas {
                let n = &self.nodes[node];
                assert!(n.chunks.contains(id), "chunk {} missing from {node}", id.0);
                let s = space.entry(*node).or_default();
                *s = s.plus(chunk.size);
            }
            assert_eq!(chunk.moving.is_some(), self.moving.contains(id), "chunk {} moving set", id.0);
            if let Some(m) = chunk.moving {
                assert_eq!(m.chunk, *id);
                assert!(chunk.replicas.contains(&m.to) && !chunk.replicas.contains(&m.from));
                let s = incoming.entry(m.to).or_default();
                *s = s.plus(chunk.size);
                let s = outgoing.entry(m.from).or_default();
                *s = s.plus(chunk.size);
            }
        }
        assert_eq!(total, self.chunk_total, "total chunk space");
        for (id, n) in &self.nodes {
            assert_eq!(n.chunk_space, space.get(id).copied().unwrap_or_default(), "{id} chunk space");
            assert_eq!(n.incoming, incoming.get(id).copied().unwrap_or_default(), "{id} incoming");
            assert_eq!(n.outgoing, outgoing.get(id).copied().unwrap_or_default(), "{id} outgoing");
            let hosted = n.chunks.iter().filter(|c| self.chunks.get(c).is_some_and(|s| s.replicas.contains(id)));
            assert_eq!(hosted.count(), n.chunks.len(), "{id} lists a chunk that is not on it");
        }
    }
}
