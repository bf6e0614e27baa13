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

/// A replicated volume's definition, the same on every replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeDef {
    pub id: u32,
    pub name: String,
    pub size_bytes: u64,
    pub page_size: u32,
    pub replicas: Vec<u64>,
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
}

/// A [`Forward`]'s answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Answer {
    Done,
    Pages(Vec<Option<Vec<u8>>>),
    VolumeId(u32),
    Status(LocalStatus),
    Redo(crate::redo::RedoReply),
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
}

/// A node's groups, for `tundra cluster status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalStatus {
    pub node: u64,
    pub groups: Vec<GroupView>,
}
