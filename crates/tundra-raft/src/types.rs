//! The Raft vocabulary of a chunk group: the type configuration openraft is built with, the
//! entry a group replicates (a [`StoreCommand`]'s bytes), what applying one answers, and the
//! snapshot a replica that fell behind installs.

use std::io::Cursor;

use openraft::{EmptyNode, Entry};
use tundra_store::command::StoreCommand;
use tundra_store::ids::ChunkId;

use crate::runtime::SeededTokio;

/// A node of the cluster, as Raft names it.
pub type NodeId = u64;

/// One Raft group per chunk (seed 000 §3.2.1): the group's id is its chunk's.
pub type GroupId = ChunkId;

openraft::declare_raft_types!(
    /// The type configuration of every chunk group.
    pub TypeConfig:
        D = Proposal,
        R = Applied,
        NodeId = NodeId,
        Node = EmptyNode,
        Entry = Entry<TypeConfig>,
        SnapshotData = ChunkSnapshot,
        AsyncRuntime = SeededTokio,
);

/// A Raft instance of one chunk group.
pub type Raft = openraft::Raft<TypeConfig>;

/// The payload of a group's log entry: a [`StoreCommand`]'s versioned encoding
/// (docs/format.md, "Store commands"), as the leader built it once with its images already
/// compressed. Followers decode and apply it; nothing on their side compresses.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Proposal {
    #[serde(with = "crate::codec::bytes")]
    pub command: Vec<u8>,
    /// The id of the client request this entry carries out (0: none), so that a leader asked
    /// again after an answer was lost can tell whether the first attempt took effect
    /// ([`crate::state_machine::AppliedRequests`]).
    pub request: u64,
}

impl Proposal {
    pub fn new(command: &StoreCommand) -> Proposal {
        Proposal { command: command.encode(), request: 0 }
    }
}

impl std::fmt::Display for Proposal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "command of {} bytes", self.command.len())
    }
}

/// What applying an entry answered: the command was applied, or every replica refused it the
/// same way (a command of another chunk, an image that does not fit its volume).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Applied {
    pub refused: Option<String>,
}

/// A chunk's state sent whole to a replica that fell behind the leader's purged log: the
/// encoding of one [`StoreCommand::PutPages`] naming every page of the chunk with its stored
/// image (never compressed again). The Raft snapshot's metadata carries the log position and
/// membership it stands for.
pub type ChunkSnapshot = Cursor<Vec<u8>>;
