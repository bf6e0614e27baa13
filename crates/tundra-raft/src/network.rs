//! Messages between nodes: every group's Raft RPCs travel over one link per pair of nodes,
//! each tagged with its group ([`Envelope`]), and a node's [`crate::host::Host`] hands each to
//! its group's Raft. The link itself is a [`Transport`]: the simulated network in the tests, a
//! TCP connection per peer in a cluster.
//!
//! A link that loses a message answers after a while with a network error, never with
//! openraft's `Unreachable` (which makes a replication task back off on an unbiased select:
//! the one place where openraft's own choices could differ between two runs of a seed).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use openraft::error::{Fatal, NetworkError, RPCError, RaftError, RemoteError, ReplicationClosed, StreamingError};
use openraft::network::RPCOption;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse};
use openraft::storage::{Snapshot, SnapshotMeta};
use openraft::{EmptyNode, OptionalSend, RaftNetwork, RaftNetworkFactory, Vote};

use crate::types::{GroupId, NodeId, TypeConfig};

/// A Raft RPC of one group.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub enum Rpc {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    /// A whole snapshot: its metadata and the chunk's images.
    Snapshot {
        vote: Vote<NodeId>,
        meta: SnapshotMeta<NodeId, EmptyNode>,
        #[serde(with = "crate::codec::bytes")]
        data: Vec<u8>,
    },
    /// A page's stored image, asked by a replica whose own copy fails its checksum (repair.rs).
    FetchPage {
        page: u32,
    },
}

impl Rpc {
    /// A one-word name and the figures that identify the message, for traces.
    pub fn summary(&self) -> String {
        match self {
            Rpc::Append(rpc) => format!(
                "append v={} prev={:?} n={} commit={:?}",
                rpc.vote,
                rpc.prev_log_id.map(|id| id.index),
                rpc.entries.len(),
                rpc.leader_commit.map(|id| id.index)
            ),
            Rpc::Vote(rpc) => format!("vote v={} last={:?}", rpc.vote, rpc.last_log_id.map(|id| id.index)),
            Rpc::Snapshot { vote, meta, data } => {
                format!("snapshot v={vote} last={:?} bytes={}", meta.last_log_id.map(|id| id.index), data.len())
            }
            Rpc::FetchPage { page } => format!("fetch page={page}"),
        }
    }
}

/// The answer to an [`Rpc`], from the target group's Raft.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub enum Reply {
    Append(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    Snapshot(Result<SnapshotResponse<NodeId>, Fatal<NodeId>>),
    /// The page's verified stored image as an encoded `StoreCommand::PutPages` of the chunk
    /// (no page when the peer holds none), or why the peer has no good copy.
    Page(Result<Vec<u8>, String>),
}

/// One message on a link between two nodes.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Envelope {
    pub from: NodeId,
    pub to: NodeId,
    #[serde(with = "crate::codec::chunk")]
    pub group: GroupId,
    pub rpc: Rpc,
}

/// A boxed future of a transport's answer.
pub type Call = Pin<Box<dyn Future<Output = Result<Reply, String>> + Send>>;

/// What carries envelopes between nodes and brings back the answer; an error means no answer
/// came (lost, the link is down, the peer does not host the group).
pub trait Transport: Send + Sync + 'static {
    fn call(&self, envelope: Envelope) -> Call;
}

/// Makes the clients one group's Raft uses to reach its peers, all over the node's transport.
pub struct GroupNetwork {
    pub transport: Arc<dyn Transport>,
    pub from: NodeId,
    pub group: GroupId,
}

impl RaftNetworkFactory<TypeConfig> for GroupNetwork {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, _node: &EmptyNode) -> PeerClient {
        PeerClient { transport: self.transport.clone(), from: self.from, to: target, group: self.group }
    }
}

/// One group's client of one peer.
pub struct PeerClient {
    transport: Arc<dyn Transport>,
    from: NodeId,
    to: NodeId,
    group: GroupId,
}

impl PeerClient {
    async fn call(&self, rpc: Rpc) -> Result<Reply, NetworkError> {
        let envelope = Envelope { from: self.from, to: self.to, group: self.group, rpc };
        self.transport.call(envelope).await.map_err(|e| NetworkError::new(&std::io::Error::other(e)))
    }
}

fn mismatch() -> NetworkError {
    NetworkError::new(&std::io::Error::other("a reply of another kind than the request"))
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, EmptyNode, RaftError<NodeId>>> {
        let t0 = std::time::Instant::now();
        let some = !rpc.entries.is_empty();
        let r = self.call(Rpc::Append(rpc)).await;
        if some {
            crate::lat::note("leader.append_rpc_roundtrip", t0);
        }
        match r? {
            Reply::Append(Ok(response)) => Ok(response),
            Reply::Append(Err(error)) => Err(RPCError::RemoteError(RemoteError::new(self.to, error))),
            _ => Err(mismatch().into()),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, EmptyNode, RaftError<NodeId>>> {
        match self.call(Rpc::Vote(rpc)).await? {
            Reply::Vote(Ok(response)) => Ok(response),
            Reply::Vote(Err(error)) => Err(RPCError::RemoteError(RemoteError::new(self.to, error))),
            _ => Err(mismatch().into()),
        }
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote<NodeId>,
        snapshot: Snapshot<TypeConfig>,
        _cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<NodeId>, StreamingError<TypeConfig, Fatal<NodeId>>> {
        let data = snapshot.snapshot.into_inner();
        match self.call(Rpc::Snapshot { vote, meta: snapshot.meta, data }).await? {
            Reply::Snapshot(Ok(response)) => Ok(response),
            Reply::Snapshot(Err(error)) => Err(StreamingError::RemoteError(RemoteError::new(self.to, error))),
            _ => Err(mismatch().into()),
        }
    }
}
