//! What nodes ask each other, besides Raft: the bodies of peer frames. A request is a group's
//! Raft RPC or a [`Forward`]: page I/O sent to a chunk's leader, a replicated volume's
//! creation on each replica, and the views `tundra cluster status` merges.

use serde::{Deserialize, Serialize};
use tundra_raft::network::{Envelope, Reply};

/// A request on a peer connection.
#[derive(Debug, Serialize, Deserialize)]
pub enum PeerRequest {
    Raft(Envelope),
    Forward(Forward),
}

/// The answer to a [`PeerRequest`].
#[derive(Debug, Serialize, Deserialize)]
pub enum PeerResponse {
    Raft(Result<Reply, String>),
    Forward(Result<Answer, Refusal>),
}

/// A piece of one page to write: whole when `within` is 0 and `bytes` is the page size.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageWrite {
    pub page: u32,
    pub within: u32,
    pub bytes: Vec<u8>,
}

/// A replicated volume's definition, the same in every node's catalog.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeDef {
    pub id: u32,
    pub name: String,
    pub size_bytes: u64,
    pub page_size: u32,
    /// The replicas of every chunk of a volume whose chunks all live on the same nodes (a
    /// volume made before placement per chunk); ignored where `chunks` names a chunk's.
    pub replicas: Vec<u64>,
    /// Each chunk's replica set, by chunk index, as placement chose it and moves changed it.
    #[serde(default)]
    pub chunks: Vec<Vec<u64>>,
    /// Moves of a chunk's replica under way (at most one per chunk): entered in every catalog
    /// before the move starts and removed once it finished or was rolled back, so a node that
    /// restarts finds it and settles it.
    #[serde(default)]
    pub moves: Vec<ChunkMove>,
    /// The replicas of the volume's redo group, once a move changed them or a chunk's move
    /// changed `replicas` (which then no longer names them); `None`: `replicas`.
    #[serde(default)]
    pub redo: Option<Vec<u64>>,
    /// A move of a redo replica under way, entered in every catalog as a chunk's is.
    #[serde(default)]
    pub redo_move: Option<RedoMove>,
    /// The volume is being deleted (delete.rs): entered in every catalog before any node
    /// drops anything, so that every node finishes the delete, even one that restarts.
    #[serde(default)]
    pub deleting: bool,
    /// The size the volume serves while a resize is between its two phases (resize.rs):
    /// `size_bytes` is then the new size (its chunks entered, the store grown) and no I/O or
    /// redo reaches past this one. `None`: `size_bytes`.
    #[serde(default)]
    pub served_bytes: Option<u64>,
}

/// A replica of a volume's redo group moving from one node to another (migrate.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedoMove {
    pub from: u64,
    pub to: u64,
}

/// A chunk replica moving from one node to another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkMove {
    pub chunk: u32,
    pub from: u64,
    pub to: u64,
}

impl VolumeDef {
    /// A volume on nodes 1 to 3 with `chunks` chunks, no move, no redo group (for tests).
    #[cfg(test)]
    pub(crate) fn for_test(id: u32, name: &str, size_bytes: u64, chunks: usize) -> VolumeDef {
        VolumeDef {
            id,
            name: name.to_string(),
            size_bytes,
            page_size: 8192,
            replicas: vec![1, 2, 3],
            chunks: vec![vec![1, 2, 3]; chunks],
            moves: Vec::new(),
            redo: None,
            redo_move: None,
            deleting: false,
            served_bytes: None,
        }
    }

    /// The nodes holding a replica of the volume's chunk `index`, lowest id first.
    pub fn replicas_of(&self, index: u32) -> &[u64] {
        self.chunks.get(index as usize).map_or(self.replicas.as_slice(), Vec::as_slice)
    }

    /// Whether `node` holds a replica of chunk `index`.
    pub fn holds(&self, node: u64, index: u32) -> bool {
        self.replicas_of(index).contains(&node)
    }

    /// Whether `node` runs a group for chunk `index`: a replica, or the target of its move.
    pub fn runs(&self, node: u64, index: u32) -> bool {
        self.holds(node, index) || self.moves.iter().any(|m| m.chunk == index && m.to == node)
    }

    /// The nodes holding a replica of the volume's redo group, lowest id first.
    pub fn redo_replicas(&self) -> &[u64] {
        self.redo.as_deref().unwrap_or(&self.replicas)
    }

    /// Whether `node` runs the volume's redo group: a replica, or the target of its move.
    pub fn runs_redo(&self, node: u64) -> bool {
        self.redo_replicas().contains(&node) || self.redo_move.is_some_and(|m| m.to == node)
    }

    /// The bytes the volume serves: every I/O and redo range check of a replicated volume
    /// uses this, never the store's size alone (a resize grows the stores first, resize.rs).
    pub fn served_size(&self) -> u64 {
        self.served_bytes.unwrap_or(self.size_bytes)
    }

    /// The move of chunk `index` under way, if any.
    pub fn move_of(&self, index: u32) -> Option<ChunkMove> {
        self.moves.iter().copied().find(|m| m.chunk == index)
    }
}

/// A node's drive space, as placement counts it (seed 000 §4.2.1): capacity and usage on the
/// logical axis (pages' uncompressed bytes) and the physical one (the drive's media).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeUsage {
    pub logical_capacity_bytes: u64,
    pub physical_capacity_bytes: u64,
    pub logical_used_bytes: u64,
    pub physical_used_bytes: u64,
    /// The node's drive takes volumes beyond its space (`overcommit = true` under [drive]).
    #[serde(default)]
    pub overcommit: bool,
}

/// Work one node asks of another.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Forward {
    /// Pieces of pages of one chunk, written by its leader in one proposal. `request` names
    /// the client request (the same on every attempt); `retry` says an earlier attempt's
    /// answer was lost, so the leader first checks whether it took effect.
    Write { volume: u32, chunk: u64, pages: Vec<PageWrite>, request: u64, retry: bool },
    /// Pages of one chunk, read by its leader (linearizable).
    Read { volume: u32, chunk: u64, pages: Vec<u32> },
    /// Pages of one chunk removed through its group.
    Trim { volume: u32, chunk: u64, pages: Vec<u32> },
    /// The volume id this node would give out next, if it has no volume named `name`.
    Prepare { name: String },
    /// Create a replicated volume's replica here and start its chunks' groups.
    CreateVolume(VolumeDef),
    /// Make the replicas the first membership of each of the volume's groups.
    Initialize { volume: u32 },
    /// This node's view of its groups.
    LocalStatus,
    /// A call on a replicated volume's redo stream, done by its redo group's leader.
    Redo { volume: u32, call: crate::redo::RedoCall },
    /// This node's drive space, for placement.
    Usage,
    /// Enter chunk `chunk`'s replica set and the move under way (if any) in the catalog.
    SetChunk { volume: u32, chunk: u32, replicas: Vec<u64>, moving: Option<ChunkMove> },
    /// Start an empty replica of the chunk's group here (a move's target).
    StartReplica { volume: u32, chunk: u32 },
    /// Stop this node's replica of the chunk and free its pages (a move's source, or a
    /// target rolled back).
    DropReplica { volume: u32, chunk: u32 },
    /// At the chunk's leader: a membership change of its group.
    Membership { volume: u32, chunk: u32, change: MembershipChange },
    /// A call on the cluster manager, done by its group's leader (manager.rs).
    Manager(crate::manager::ManagerCall),
    /// The logical and physical bytes of every chunk replica this node runs (seed 000 §4.2.2:
    /// the scheduler's per-chunk ratios). Added after the other variants, so that their
    /// encodings are unchanged.
    ChunkSizes,
    /// Enter the volume's redo replica set and the move of one under way (if any) in the
    /// catalog (migrate.rs).
    SetRedo { volume: u32, replicas: Vec<u64>, moving: Option<RedoMove> },
    /// Start this node's replica of the volume's redo group (a move's target).
    StartRedo { volume: u32 },
    /// Stop this node's replica of the volume's redo group and drop its stream (a move's
    /// source, or a target rolled back).
    DropRedo { volume: u32 },
    /// At the redo group's leader: a membership change of the group.
    RedoMembership { volume: u32, change: MembershipChange },
    /// Start a member of the manager's group here (manager_members.rs).
    ManagerJoin,
    /// Stop this node's member of the manager's group for good (manager_members.rs).
    ManagerLeave,
    /// A step of deleting a replicated volume here (delete.rs).
    Delete { volume: u32, step: crate::delete::DeleteStep },
    /// A step of growing a replicated volume here (resize.rs).
    Resize { volume: u32, step: crate::resize::ResizeStep },
    /// This node's catalog of replicated volumes: what a node that was down learns created
    /// volumes from (adopt.rs).
    Catalog,
    /// The ids of the replicated volumes deleted on this node: what a node that was down
    /// while a volume was deleted learns the delete from (adopt.rs).
    DeletedVolumes,
    /// Heavy compression of `count` pages of one chunk from `first`, by its leader (io.rs).
    Heavy { volume: u32, chunk: u64, first: u32, count: u32 },
    /// A move's target adopts the volume before it is told of the move, if its catalog lacks
    /// it (a node added to the cluster since the volume's creation, adopt.rs).
    Adopt(VolumeDef),
    /// Node `id`, at peer address `addr`, joins the cluster (join.rs): this node links it and
    /// keeps it in its data directory.
    AddPeer { id: u64, addr: String },
    /// Every node this node knows, with its peer address (join.rs: a node that missed an
    /// addition learns it from its peers).
    Peers,
}

/// A change of a chunk group's membership, done by its leader.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum MembershipChange {
    /// Only report the voters and learners, once a quorum confirmed this node still leads.
    Query,
    /// Add a learner and answer once it caught up.
    AddLearner(u64),
    /// Make these the voters (learners not among them are removed).
    Voters(Vec<u64>),
    RemoveLearner(u64),
    /// [`MembershipChange::Query`], refused while the membership is not settled (joint, or
    /// not applied yet): what a node's catalog catch-up trusts before it drops a replica
    /// (dead_nodes.rs).
    ConfirmedQuery,
}

/// A [`Forward`]'s answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Answer {
    Done,
    Pages(Vec<Option<Vec<u8>>>),
    VolumeId(u32),
    Status(LocalStatus),
    Redo(crate::redo::RedoReply),
    Usage(NodeUsage),
    Members {
        voters: Vec<u64>,
        learners: Vec<u64>,
    },
    Manager(crate::manager::ManagerReply),
    ChunkSizes(Vec<ChunkSize>),
    /// A volume in this node's catalog: `None` when it is not there (never was, or deleted),
    /// else whether it is marked deleting.
    Deleting(Option<bool>),
    /// A volume's sizes on this node and whether its store can grow (resize.rs).
    Resize(crate::resize::ResizeCheck),
    /// A node's catalog ([`Forward::Catalog`]).
    Catalog(Vec<VolumeDef>),
    /// [`Forward::DeletedVolumes`]'s ids, ascending.
    DeletedVolumes(Vec<u32>),
    /// What a [`Forward::Heavy`] stored.
    Heavy(HeavyDone),
    /// [`Forward::Peers`]'s nodes and peer addresses, by id.
    Peers(Vec<(u64, String)>),
}

/// Heavy compression's figures for a range: the pages its segments named, the segments, and
/// the 4 KiB-rounded bytes those pages took before and the segments take.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeavyDone {
    pub pages: u64,
    pub segments: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// One chunk replica's space on a node, counted as the node's [`NodeUsage`] is: logical bytes
/// are live pages times the page size, physical bytes the drive's media bytes under the
/// chunk's blocks (after software and drive compression).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkSize {
    pub volume: u32,
    /// The chunk's index in its volume.
    pub chunk: u32,
    pub pages: u64,
    pub logical_bytes: u64,
    pub physical_bytes: u64,
}

/// Why a [`Forward`] was not done.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Refusal {
    /// The node does not lead the chunk; `leader` is its guess.
    NotLeader { leader: Option<u64> },
    /// No answer can be given now (no quorum, the leader changed while the request ran):
    /// retry. A write's effect is unknown.
    Unavailable(String),
    /// The request is wrong and retrying will not help.
    Invalid(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Invalid(why) | Refusal::Unavailable(why) => f.write_str(why),
            Refusal::NotLeader { leader } => write!(f, "not the leader (leader {leader:?})"),
        }
    }
}

/// One group as a node sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupView {
    pub volume: u32,
    pub chunk: u64,
    pub leader: Option<u64>,
    pub term: u64,
    pub last_log_index: Option<u64>,
    pub commit_index: Option<u64>,
    pub applied_index: Option<u64>,
    pub voters: Vec<u64>,
    /// The last log index this replica purged (its log holds the entries after it).
    pub purged_index: Option<u64>,
}

/// A node's groups, for `tundra cluster status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalStatus {
    pub node: u64,
    pub groups: Vec<GroupView>,
    pub usage: NodeUsage,
}
