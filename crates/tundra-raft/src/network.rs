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
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use openraft::error::{Fatal, NetworkError, RPCError, RaftError, RemoteError, ReplicationClosed, StreamingError};
use openraft::network::RPCOption;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse};
use openraft::storage::{Snapshot, SnapshotMeta};
use openraft::{EmptyNode, Entry, EntryPayload, LogId, OptionalSend, RaftNetwork, RaftNetworkFactory, Vote};

use crate::log::NodeLog;
use crate::snapshot::{PIECE_BYTES, SnapshotBug, SnapshotFiles};
use crate::types::{GroupId, NodeId, TypeConfig};

/// A Raft RPC of one group.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub enum Rpc {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    /// A snapshot's metadata and manifest (snapshot.rs), sent once its extents arrived.
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
    /// A piece of a snapshot's extents, pushed by the sender (snapshot.rs): `data` is the bytes
    /// from `offset` of the `total`, `crc` their crc32c. Empty data asks how much the receiver
    /// holds.
    SnapshotPiece {
        snapshot_id: String,
        total: u64,
        offset: u64,
        #[serde(with = "crate::codec::bytes")]
        data: Vec<u8>,
        crc: u32,
    },
    /// Would the receiver vote for the sender, whose last log id is `last_log_id`, if it
    /// campaigned now? (campaign.rs: a pre-vote; nothing changes on either side.)
    PreVote {
        last_log_id: Option<LogId<NodeId>>,
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
            Rpc::SnapshotPiece { snapshot_id, offset, data, .. } => {
                format!("piece id={snapshot_id} at={offset} bytes={}", data.len())
            }
            Rpc::PreVote { last_log_id } => format!("pre-vote last={:?}", last_log_id.map(|id| id.index)),
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
    /// How many bytes of the snapshot's extents the receiver holds, after the piece.
    Piece(Result<u64, String>),
    /// Whether the receiver would vote for the pre-vote's sender.
    PreVote(bool),
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

    /// Whether the link to `peer` is up now, as far as the transport knows. A leader captures
    /// no snapshot while every follower that needs one is out of reach
    /// ([`crate::state_machine::ChunkStateMachine`]). Without the knowledge, every link is up.
    fn is_connected(&self, _peer: NodeId) -> bool {
        true
    }
}

/// Makes the clients one group's Raft uses to reach its peers, all over the node's transport.
pub struct GroupNetwork {
    pub transport: Arc<dyn Transport>,
    pub from: NodeId,
    pub group: GroupId,
    pub files: Arc<SnapshotFiles>,
    /// The node's shared log: how far the group's entries are durable here.
    pub log: Arc<NodeLog>,
    /// How many bytes of entries one append carries.
    pub cap: Arc<AppendCap>,
}

/// The most bytes of entries one append carries, as their commands' encoded size (an append
/// always carries at least one entry). openraft 0.9 bounds an append by its count of entries
/// alone (300 by default), and an entry of a chunk group holds up to 64 pages: a follower that
/// fell behind was sent appends of tens of megabytes. On a loaded machine one took longer than
/// the transport's timeout to cross, was sent again behind the first on the same connection,
/// and the two nodes left with a dead third stopped answering each other for good (PostgreSQL
/// on a replicated mount then stood at 0 tps until its writes failed).
pub const APPEND_BYTES: usize = PIECE_BYTES;

/// What an entry weighs against [`APPEND_BYTES`] besides its command: its log id, the
/// proposal's request id and the encoding's framing, or a membership.
const ENTRY_OVERHEAD: usize = 64;

/// How many bytes of entries a node's appends carry ([`APPEND_BYTES`] unless a test sets
/// another), and a twin's bug.
#[derive(Debug)]
pub struct AppendCap {
    bytes: AtomicUsize,
    /// The injected bug of a simulation twin: an append cut short answers openraft as if the
    /// follower took every entry it was asked to send.
    claims_all: AtomicBool,
    /// Appends cut short since the node started.
    cut: AtomicU64,
}

impl Default for AppendCap {
    fn default() -> AppendCap {
        AppendCap { bytes: AtomicUsize::new(APPEND_BYTES), claims_all: AtomicBool::new(false), cut: Default::default() }
    }
}

impl AppendCap {
    pub fn set_bytes(&self, bytes: usize) {
        self.bytes.store(bytes, Ordering::Relaxed);
    }

    pub fn set_claims_all(&self, on: bool) {
        self.claims_all.store(on, Ordering::Relaxed);
    }

    /// How many appends were cut short.
    pub fn cut(&self) -> u64 {
        self.cut.load(Ordering::Relaxed)
    }

    /// Cuts `entries` to the first ones within the cap (at least one), and answers the log id
    /// of the last one kept when any was cut.
    fn keep_within(&self, entries: &mut Vec<Entry<TypeConfig>>) -> Option<LogId<NodeId>> {
        let cap = self.bytes.load(Ordering::Relaxed);
        let mut bytes = 0usize;
        let mut keep = 0usize;
        for entry in entries.iter() {
            bytes += ENTRY_OVERHEAD
                + match &entry.payload {
                    EntryPayload::Normal(proposal) => proposal.command.len(),
                    _ => 0,
                };
            if keep > 0 && bytes > cap {
                break;
            }
            keep += 1;
        }
        if keep == entries.len() {
            return None;
        }
        entries.truncate(keep);
        self.cut.fetch_add(1, Ordering::Relaxed);
        entries.last().map(|entry| entry.log_id)
    }
}

impl RaftNetworkFactory<TypeConfig> for GroupNetwork {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, _node: &EmptyNode) -> PeerClient {
        PeerClient {
            transport: self.transport.clone(),
            from: self.from,
            to: target,
            group: self.group,
            files: self.files.clone(),
            log: self.log.clone(),
            cap: self.cap.clone(),
        }
    }
}

/// One group's client of one peer.
pub struct PeerClient {
    transport: Arc<dyn Transport>,
    from: NodeId,
    to: NodeId,
    group: GroupId,
    files: Arc<SnapshotFiles>,
    log: Arc<NodeLog>,
    cap: Arc<AppendCap>,
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
    /// The commit position sent goes no further than the leader's entries durable here (a
    /// leader's own appends are reported flushed early, log/mod.rs): a follower never applies
    /// an entry a majority does not hold durably.
    ///
    /// The entries sent are the first within [`APPEND_BYTES`]; when some were left out, the
    /// follower's success is answered as openraft's partial success up to the last one sent,
    /// and openraft sends the rest next. The follower commits no further than the entries it
    /// took from this leader, whatever commit position it is told.
    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, EmptyNode, RaftError<NodeId>>> {
        rpc.leader_commit = self.log.durable_commit(self.group, rpc.leader_commit);
        let cut = self.cap.keep_within(&mut rpc.entries);
        let t0 = std::time::Instant::now();
        let some = !rpc.entries.is_empty();
        if some {
            crate::lat::mark("rpc");
        }
        let r = self.call(Rpc::Append(rpc)).await;
        if some {
            crate::lat::mark("rpc.done");
            crate::lat::note("leader.append_rpc_roundtrip", t0);
        }
        match r? {
            Reply::Append(Ok(AppendEntriesResponse::Success))
                if cut.is_some() && !self.cap.claims_all.load(Ordering::Relaxed) =>
            {
                Ok(AppendEntriesResponse::PartialSuccess(cut))
            }
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
        if data.is_empty() && crate::manager_machine::is_chunk_group(self.group) {
            // A chunk's mark alone, captured for no one: every follower that needs a snapshot
            // was out of reach when openraft asked for it, or the chunk's images are still
            // being read ahead of the capture (state_machine.rs `read_ahead_done`). Nothing is
            // sent; openraft asks again after this pause, and a follower in reach by then gets
            // a capture.
            tokio::time::sleep(UNREACHED_PAUSE).await;
            let why = format!("no snapshot captured yet for node {} (out of reach, or being read ahead)", self.to);
            return Err(NetworkError::new(&std::io::Error::other(why)).into());
        }
        if streams_extents(self.group) {
            let link = Link { transport: self.transport.as_ref(), from: self.from, to: self.to, group: self.group };
            push_extents(&link, &self.files, &snapshot.meta.snapshot_id)
                .await
                .map_err(|e| NetworkError::new(&std::io::Error::other(e)))?;
        }
        match self.call(Rpc::Snapshot { vote, meta: snapshot.meta, data }).await? {
            Reply::Snapshot(Ok(response)) => Ok(response),
            Reply::Snapshot(Err(error)) => Err(StreamingError::RemoteError(RemoteError::new(self.to, error))),
            _ => Err(mismatch().into()),
        }
    }
}

/// How long a snapshot send for a follower out of reach waits before it fails (and openraft
/// asks for the snapshot again).
const UNREACHED_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);

/// One group's way to one peer, for a snapshot's pieces.
pub struct Link<'a> {
    pub transport: &'a dyn Transport,
    pub from: NodeId,
    pub to: NodeId,
    pub group: GroupId,
}

/// How many times in a row a piece may come back unaccepted (a checksum the receiver refused,
/// or the link lost it) before the transfer gives up; openraft sends the snapshot again later,
/// and the transfer resumes from what the receiver holds.
const PIECE_TRIES: u32 = 8;

/// Pushes snapshot `id`'s extents to the peer in pieces, from what the peer holds already
/// (snapshot.rs): a transfer cut short resumes where it stopped. Answers the bytes of extents
/// sent, for the tests.
/// Whether a group's snapshots are a manifest plus streamed extents: a chunk's, and a volume's
/// redo group's (its copy of the stream; a mark alone has no extents). The cluster manager's
/// group sends its snapshot whole in [`Rpc::Snapshot`].
pub fn streams_extents(group: GroupId) -> bool {
    group.0 >> 63 == 0 || crate::redo_machine::redo_volume(group).is_some()
}

pub async fn push_extents(link: &Link<'_>, files: &SnapshotFiles, id: &str) -> Result<u64, String> {
    let total = files.extents_len(link.group, id)?;
    let send = |offset: u64, data: Vec<u8>| {
        let crc = crc32c::crc32c(&data);
        let rpc = Rpc::SnapshotPiece { snapshot_id: id.to_string(), total, offset, data, crc };
        let envelope = Envelope { from: link.from, to: link.to, group: link.group, rpc };
        async move {
            match link.transport.call(envelope).await? {
                Reply::Piece(held) => held,
                _ => Err("a reply of another kind than the request".to_string()),
            }
        }
    };
    let mut held = send(0, Vec::new()).await?;
    if files.bug() == SnapshotBug::ResumeFromZero {
        held = 0;
    }
    let mut sent = 0u64;
    let mut refused = 0;
    while held < total {
        let piece = files.extents_piece(link.group, id, held, PIECE_BYTES)?;
        if piece.is_empty() {
            return Err(format!("snapshot {id}: its extents end at {held} of {total} bytes"));
        }
        sent += piece.len() as u64;
        let now = match send(held, piece).await {
            Ok(now) => now,
            Err(_) if refused + 1 < PIECE_TRIES => held,
            Err(error) => return Err(error),
        };
        if now > held {
            refused = 0;
        } else {
            refused += 1;
            if refused >= PIECE_TRIES {
                return Err(format!("snapshot {id}: the peer took no piece at {held} in {PIECE_TRIES} tries"));
            }
        }
        held = now;
    }
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Proposal;
    use openraft::CommittedLeaderId;

    fn entries(sizes: &[usize]) -> Vec<Entry<TypeConfig>> {
        (0..sizes.len())
            .map(|i| Entry {
                log_id: LogId::new(CommittedLeaderId::new(2, 1), 10 + i as u64),
                payload: EntryPayload::Normal(Proposal { command: vec![7; sizes[i]], request: 0 }),
            })
            .collect()
    }

    #[test]
    fn an_append_keeps_the_entries_within_its_cap_and_names_the_last_one() {
        let cap = AppendCap::default();
        // Ten entries of 300 KiB: three fit in 1 MiB.
        let mut batch = entries(&[300 << 10; 10]);
        assert_eq!(cap.keep_within(&mut batch).map(|id| id.index), Some(12));
        assert_eq!(batch.len(), 3);
        // One entry over the cap still goes, alone.
        let mut big = entries(&[3 << 20, 10]);
        assert_eq!(cap.keep_within(&mut big).map(|id| id.index), Some(10));
        assert_eq!(big.len(), 1);
        // What fits is not cut, and says so.
        let mut small = entries(&[1000; 20]);
        assert_eq!(cap.keep_within(&mut small), None);
        assert_eq!(small.len(), 20);
        assert_eq!(cap.keep_within(&mut Vec::new()), None);
        assert_eq!(cap.cut(), 2);
        // A cap of one byte: one entry per append.
        cap.set_bytes(1);
        let mut one = entries(&[1, 1, 1]);
        assert_eq!(cap.keep_within(&mut one).map(|id| id.index), Some(10));
        assert_eq!(one.len(), 1);
    }
}
