//! A node's replication host: every chunk group the node holds a replica of, one Raft each,
//! over the node's store, its page path and its shared log; the one entry point for messages
//! from peers ([`Host::handle`]); and the leader's write and read paths.
//!
//! Writes follow seed 000 Figure 4: the leader compresses the pages once (Algorithm 1, through
//! [`Pages::encode_pages`]), proposes the command, and answers only after a majority holds the
//! entry durably and the leader applied it; followers apply the same bytes when they learn the
//! entry committed. Reads on the leader first confirm leadership with a quorum and wait until
//! the leader applied everything committed before the read (openraft's `ensure_linearizable`).
//!
//! Heartbeats: each group sends its own, so their cost grows with the groups per node
//! ([`heartbeat_config`] says how the intervals are chosen so that a node with many groups
//! stays cheap). A group takes its timing when it starts, from the groups the host runs once
//! the groups started with it are added ([`Host::add_groups_on`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::{Config, EmptyNode, SnapshotPolicy};
use parking_lot::Mutex;
use tundra_store::ids::{ChunkId, Lsn, PageNo};
use tundra_store::pages::Pages;
use tundra_store::store::Store;

use crate::log::{GroupLogStore, LogMedia, NodeLog};
use crate::network::{Envelope, GroupNetwork, Reply, Rpc, Transport};
use crate::snapshot::SnapshotFiles;
use crate::state_machine::{AppliedRequests, ApplyHook, ChunkStateMachine};
use crate::types::{GroupId, NodeId, Proposal, Raft};

/// What a replicated operation can answer besides success.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// This node does not lead the group: ask the named node, if any is known.
    #[error("node {node} does not lead chunk {group}; the leader is {leader:?}")]
    NotLeader { node: NodeId, group: u64, leader: Option<NodeId> },
    /// The operation's outcome is unknown (the leader lost its quorum or its leadership, or
    /// stopped): a write may or may not be applied, and should be retried or read back.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// Every replica refused the command the same way; nothing changed.
    #[error("refused: {0}")]
    Invalid(String),
    /// This node does not host the group.
    #[error("node {node} holds no replica of chunk {group}")]
    NoGroup { node: NodeId, group: u64 },
    /// A page's stored image fails its checksum here and no other replica gave a good copy of
    /// the same version (repair.rs); nothing was read.
    #[error("corrupted: {0}")]
    Corrupted(String),
}

/// The Raft timing of a node's groups. Every group heartbeats its followers on its own, so a
/// node leading `groups` groups sends about 2 × groups / interval heartbeats a second; the
/// interval grows with the groups so that this stays near 2,000 a second (a node leading
/// 1,000 groups heartbeats each every second), with the election timeout three to six
/// intervals, as Raft asks (timeout ≫ heartbeat). The simulation runs with 50 ms.
pub fn heartbeat_config(groups: usize) -> Config {
    let interval_ms = (groups as u64).clamp(50, 1_000);
    Config {
        cluster_name: "tundra".into(),
        heartbeat_interval: interval_ms,
        election_timeout_min: 3 * interval_ms,
        election_timeout_max: 6 * interval_ms,
        // Snapshots stand for the chunk's pages; a replica that missed more than this many
        // entries is sent the chunk whole instead of the entries.
        snapshot_policy: SnapshotPolicy::LogsSinceLast(64),
        max_in_snapshot_log_to_keep: 16,
        purge_batch_size: 16,
        ..Config::default()
    }
}

/// One node's groups.
pub struct Host {
    id: NodeId,
    pages: Arc<Pages>,
    log: Arc<NodeLog>,
    transport: Arc<dyn Transport>,
    config: Arc<Config>,
    groups: Mutex<BTreeMap<GroupId, Raft>>,
    /// The page path of groups started on another than the host's (a volume of another page
    /// size).
    paths: Mutex<BTreeMap<GroupId, Arc<Pages>>>,
    hook: Option<ApplyHook>,
    requests: Arc<AppliedRequests>,
    /// Requests this node proposed as a leader whose proposals have not answered yet.
    pending: Mutex<std::collections::HashSet<u64>>,
    /// The injected bug of a simulation twin ([`Host::set_answer_at_append`]).
    answer_at_append: std::sync::atomic::AtomicBool,
    /// Repair of bad pages from peers and the background scrub (repair.rs).
    pub(crate) repair: Arc<crate::repair::Repair>,
    /// The state of this node's member of the manager group, if it runs one.
    manager: Mutex<Option<Arc<Mutex<crate::manager_machine::ManagerView>>>>,
    /// Snapshots captured to send and staged as received (snapshot.rs).
    files: Arc<SnapshotFiles>,
    /// How many bytes of entries this node's appends carry (network.rs).
    append_cap: Arc<crate::network::AppendCap>,
    /// The injected bug of a simulation twin: purges skip the purge guard.
    purge_unsynced: Arc<std::sync::atomic::AtomicBool>,
    /// Per redo group, how far its replica here may purge (redo_machine.rs).
    redo: Mutex<BTreeMap<GroupId, Arc<Mutex<crate::redo_machine::RedoProgress>>>>,
    /// The injected bug of a simulation twin: a redo leader's entries say every voter holds
    /// the whole committed log, whatever the voters' logs match.
    redo_held_committed: std::sync::atomic::AtomicBool,
    /// The injected bug of a twin: a replica forgotten here keeps its log (the store is still
    /// emptied), as before a chunk could move back to a node that held it.
    forget_keeps_log: std::sync::atomic::AtomicBool,
    /// The injected bug of a twin: forgotten replicas vote from an empty log.
    votes_unguarded: std::sync::atomic::AtomicBool,
    /// The injected bug of a twin: forgotten replicas campaign, and vote once their log names
    /// them a voter, before their log reaches what they held (`Host::short_of_held`).
    held_unguarded: std::sync::atomic::AtomicBool,
    /// When each group's replica here may campaign (campaign.rs).
    campaigns: Arc<crate::campaign::Campaigns>,
}

impl Host {
    /// A host over the node's page path and shared log medium (its records replayed now). It
    /// holds no group until [`Host::add_group`].
    pub fn open(
        id: NodeId,
        pages: Arc<Pages>,
        media: Arc<dyn LogMedia>,
        flush_latency: Duration,
        transport: Arc<dyn Transport>,
        config: Config,
        hook: Option<ApplyHook>,
    ) -> Result<Host, String> {
        let config = Arc::new(config.validate().map_err(|e| e.to_string())?);
        let log = NodeLog::open(media, flush_latency)?;
        Ok(Host {
            id,
            pages,
            log,
            transport,
            config,
            groups: Mutex::new(BTreeMap::new()),
            paths: Mutex::new(BTreeMap::new()),
            hook,
            requests: Arc::default(),
            pending: Mutex::default(),
            answer_at_append: Default::default(),
            repair: Arc::default(),
            manager: Mutex::new(None),
            files: Arc::new(SnapshotFiles::in_memory()),
            append_cap: Arc::default(),
            purge_unsynced: Arc::default(),
            redo: Mutex::default(),
            redo_held_committed: std::sync::atomic::AtomicBool::new(false),
            forget_keeps_log: std::sync::atomic::AtomicBool::new(false),
            votes_unguarded: std::sync::atomic::AtomicBool::new(false),
            held_unguarded: std::sync::atomic::AtomicBool::new(false),
            campaigns: Arc::new(crate::campaign::Campaigns::from_env()),
        })
    }

    /// Keeps snapshot files (captured extents, received stages) in `dir` on the node's disk
    /// rather than in memory; before any group starts.
    pub fn set_snapshot_dir(&mut self, dir: std::path::PathBuf) -> Result<(), String> {
        self.files = Arc::new(SnapshotFiles::in_dir(dir)?);
        Ok(())
    }

    /// The node's snapshot files (for tests: their fault switch).
    pub fn snapshot_files(&self) -> &Arc<SnapshotFiles> {
        &self.files
    }

    pub fn id(&self) -> NodeId {
        self.id
    }

    pub fn store(&self) -> &Store {
        self.pages.store()
    }

    pub fn log(&self) -> &NodeLog {
        &self.log
    }

    pub(crate) fn transport(&self) -> &Arc<dyn Transport> {
        &self.transport
    }

    /// Starts this node's replica of `group`, where its log and its store's mark left it.
    pub async fn add_group(&self, group: GroupId) -> Result<(), String> {
        self.add_group_on(group, self.pages.clone()).await
    }

    /// [`Host::add_group`] on the page path `pages` (a volume's page size and store); a group
    /// this host runs already is left as it is.
    pub async fn add_group_on(&self, group: GroupId, pages: Arc<Pages>) -> Result<(), String> {
        self.add_groups_on(&[group], pages).await
    }

    /// [`Host::add_group_on`] for several groups at once (a volume's chunks). Their timing is
    /// [`heartbeat_config`]'s for the groups this host runs once they are added, where that is
    /// slower than the host's own config: a node asked for a volume of 1,000 chunks runs them
    /// at its 1,000-group interval from the start, not at the interval it chose when it ran
    /// none. Groups running already keep theirs.
    pub async fn add_groups_on(&self, groups: &[GroupId], pages: Arc<Pages>) -> Result<(), String> {
        let config = self.config_for(groups)?;
        for &group in groups {
            self.start_group(group, pages.clone(), config.clone()).await?;
        }
        Ok(())
    }

    /// The config of groups started together with `added`.
    fn config_for(&self, added: &[GroupId]) -> Result<Arc<Config>, String> {
        let running = self.groups.lock();
        let new: BTreeSet<&GroupId> = added.iter().filter(|group| !running.contains_key(group)).collect();
        let timing = heartbeat_config(running.len() + new.len());
        drop(running);
        if timing.heartbeat_interval <= self.config.heartbeat_interval {
            return Ok(self.config.clone());
        }
        let config = Config {
            heartbeat_interval: timing.heartbeat_interval,
            election_timeout_min: timing.election_timeout_min,
            election_timeout_max: timing.election_timeout_max,
            ..(*self.config).clone()
        };
        Ok(Arc::new(config.validate().map_err(|e| e.to_string())?))
    }

    /// Starts `group`'s Raft on this node over the node's transport and shared log, with
    /// `machine` applying only entries durable in the log (log/mod.rs).
    async fn new_raft<M>(&self, group: GroupId, config: Arc<Config>, machine: M) -> Result<Raft, String>
    where
        M: openraft::storage::RaftStateMachine<crate::types::TypeConfig>,
    {
        let network = GroupNetwork {
            transport: self.transport.clone(),
            from: self.id,
            group,
            files: self.files.clone(),
            log: self.log.clone(),
            cap: self.append_cap.clone(),
        };
        let mut log = GroupLogStore::new(self.log.clone(), group, self.id);
        if self.answer_at_append.load(std::sync::atomic::Ordering::Relaxed) {
            log = log.answering_early(self.requests.clone());
        }
        let machine = crate::log::DurableApply::new(machine, self.log.clone(), group);
        let raft = Raft::new(self.id, config.clone(), network, log, machine).await.map_err(|e| e.to_string())?;
        let (log, unguarded) = (self.log.clone(), self.held_unguarded.load(std::sync::atomic::Ordering::Relaxed));
        let short = Box::new(move || !unguarded && short_of_held(&log, group));
        let log = self.log.clone();
        let last = Box::new(move || log.with_group(group, |log| log.last_log_id()));
        let reach = crate::campaign::Reach { me: self.id, group, transport: self.transport.clone(), last };
        self.campaigns.start(reach, &raft, &config, short);
        Ok(raft)
    }

    /// Whether this node's replica of `group` is still short of what it held when it was
    /// forgotten here (log/mod.rs `ResetHeld`): until its log reaches that index it neither
    /// campaigns (campaign.rs) nor votes ([`Host::refused_vote`]).
    pub fn short_of_held(&self, group: GroupId) -> bool {
        !self.held_unguarded.load(std::sync::atomic::Ordering::Relaxed) && short_of_held(&self.log, group)
    }

    async fn start_group(&self, group: GroupId, pages: Arc<Pages>, config: Arc<Config>) -> Result<(), String> {
        if self.groups.lock().contains_key(&group) {
            return Ok(());
        }
        self.paths.lock().insert(group, pages.clone());
        // The requests of the committed entries the log still holds: those a restarted node
        // applied before it stopped are never applied again, so never recorded otherwise.
        self.log.with_group(group, |log| {
            let committed = log.committed.map_or(0, |id| id.index);
            for entry in log.entries.range(..=committed).map(|(_, e)| e) {
                if let openraft::EntryPayload::Normal(proposal) = &entry.payload {
                    self.requests.record(group, proposal.request);
                }
            }
        });
        self.log.set_purge_guard(group, self.purge_guard(group, pages.clone()));
        let mut machine = ChunkStateMachine::open(
            group,
            pages,
            self.hook.clone(),
            self.requests.clone(),
            (self.id, self.files.clone()),
            self.repairer(),
        )?;
        machine.reach.transport = Some(self.transport.clone());
        let progress = machine.reach.metrics.clone();
        let raft = self.new_raft(group, config, machine).await?;
        let _ = progress.set(raft.metrics());
        self.groups.lock().insert(group, raft);
        Ok(())
    }

    /// The rule that keeps a chunk's Raft log the write-ahead log of its replica's applies
    /// (seed 000 §3.2.1): a replica applies committed entries without syncing its store
    /// (`Durability::Deferred`), and after a crash openraft applies again the entries past the
    /// store's durable mark. So no entry past that mark may leave the log: before a purge, the
    /// store's deferred records are made durable, and the purge goes only as far as the
    /// chunk's mark read before that sync (openraft also purges up to a snapshot it is still
    /// installing; the entries kept then go with a later purge).
    fn purge_guard(&self, group: GroupId, pages: Arc<Pages>) -> crate::log::PurgeGuard {
        let unsynced = self.purge_unsynced.clone();
        Arc::new(move |upto: openraft::LogId<NodeId>| {
            if unsynced.load(std::sync::atomic::Ordering::Relaxed) {
                return Ok(Some(upto.index));
            }
            let store = pages.store();
            let applied = match store.chunk_mark(group) {
                Some(bytes) => crate::mark::ApplyMark::decode(&bytes)
                    .map_err(|e| format!("chunk {}: {e}", group.0))?
                    .applied
                    .map(|id| id.index),
                None => None,
            };
            store.sync().map_err(|e| format!("chunk {}: syncing the store before a purge: {e}", group.0))?;
            Ok(applied)
        })
    }

    /// The injected bug of the simulation's twin: purges no longer wait for the store.
    #[cfg(test)]
    pub(crate) fn purge_unsynced(&self) {
        self.purge_unsynced.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Makes `voters` the first membership of a new group (on one of them, once).
    pub async fn initialize(&self, group: GroupId, voters: BTreeSet<NodeId>) -> Result<(), String> {
        let raft = self.raft(group).map_err(|e| e.to_string())?;
        raft.initialize(voters).await.map_err(|e| e.to_string())
    }

    pub fn raft(&self, group: GroupId) -> Result<Raft, Error> {
        self.groups.lock().get(&group).cloned().ok_or(Error::NoGroup { node: self.id, group: group.0 })
    }

    /// Takes `group` off this host's list (the caller stops its Raft), with its campaign gate.
    fn take_group(&self, group: GroupId) -> Option<Raft> {
        self.campaigns.stop(group);
        self.groups.lock().remove(&group)
    }

    pub fn groups(&self) -> Vec<GroupId> {
        self.groups.lock().keys().copied().collect()
    }

    /// The answer to a vote request when this replica must not vote: it was forgotten here
    /// once ([`Host::forget_group_on`]) and its log is still short of the index it held then
    /// ([`Host::short_of_held`]). A forgotten replica lost entries a quorum may have counted,
    /// and a voter that was down when this node left the group still holds a membership that
    /// counts it: granting that stale candidate a vote from a log that lacks them could elect it
    /// and overwrite committed entries. Once its log reaches that index again it holds every
    /// entry a quorum counted it for (the leaders that sent them hold every committed entry,
    /// and its kept vote refuses older leaders), so it votes as any lagging replica does, named
    /// a voter by its log or not: a group in a joint configuration may need the vote of a voter
    /// whose log does not name it one yet (the move simulation's seed 70292 stalled so). A reset
    /// written by a log of format version 2 knows no index: such a replica votes only while its
    /// log names it a voter, the rule before the index was kept. A replica never forgotten votes
    /// from an empty log (a group's first election needs that). Refusing a vote is always safe;
    /// the answer carries this replica's own vote, so a candidate of a higher term just counts
    /// no vote.
    fn refused_vote(&self, group: GroupId, raft: &Raft) -> Option<openraft::raft::VoteResponse<NodeId>> {
        if self.votes_unguarded.load(std::sync::atomic::Ordering::Relaxed) || !self.log.was_reset(group) {
            return None;
        }
        let metrics = raft.metrics().borrow().clone();
        let unguarded = self.held_unguarded.load(std::sync::atomic::Ordering::Relaxed);
        let may_vote = match self.log.reset_held(group) {
            Some(_) if !unguarded => !self.short_of_held(group),
            _ => {
                let configs = metrics.membership_config.membership().get_joint_config();
                configs.iter().any(|voters| voters.contains(&self.id))
            }
        };
        if may_vote {
            return None;
        }
        Some(openraft::raft::VoteResponse {
            vote: metrics.vote,
            vote_granted: false,
            last_log_id: self.log.with_group(group, |log| log.last_log_id()),
        })
    }

    /// The most bytes of entries one append from this node carries
    /// ([`crate::network::APPEND_BYTES`] unless set; at least one entry whatever the cap): the
    /// simulation cuts appends short with it.
    pub fn set_append_bytes(&self, bytes: usize) {
        self.append_cap.set_bytes(bytes);
    }

    /// How many appends from this node were cut short by the cap since it started.
    pub fn appends_cut(&self) -> u64 {
        self.append_cap.cut()
    }

    /// Injects a twin's bug: a proposal is answered as its entry enters this node's log, before
    /// it is committed ([`GroupLogStore::answering_early`]). Set before groups start.
    pub fn set_answer_at_append(&self, on: bool) {
        self.answer_at_append.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Injects a twin's bug: an append cut short by the cap answers openraft that the follower
    /// took every entry it was asked to send.
    pub fn set_append_claims_all(&self, on: bool) {
        self.append_cap.set_claims_all(on);
    }

    /// Injects a twin's bug: replicas forgotten here vote from an empty log
    /// ([`Host::refused_vote`] off). For the tests that show their checks catch it.
    pub fn set_votes_unguarded(&self, on: bool) {
        self.votes_unguarded.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Injects a twin's bug: every replica started here from now on campaigns on openraft's
    /// election timer alone, without a pre-vote (campaign.rs off). Set before groups start.
    pub fn set_campaigns_unguarded(&self, on: bool) {
        self.campaigns.set_unguarded(on);
    }

    /// Injects a twin's bug: replicas forgotten here campaign before their log reaches what
    /// they held, and vote once their log names them a voter, as before the index held was kept
    /// ([`Host::short_of_held`] off).
    pub fn set_held_unguarded(&self, on: bool) {
        self.held_unguarded.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// A message from a peer, handed to its group's Raft.
    pub async fn handle(&self, envelope: Envelope) -> Result<Reply, String> {
        let raft = self.raft(envelope.group).map_err(|e| e.to_string())?;
        Ok(match envelope.rpc {
            Rpc::Append(rpc) => {
                self.campaigns.heard_leader(envelope.group);
                let t0 = std::time::Instant::now();
                let some = !rpc.entries.is_empty();
                if some {
                    crate::lat::mark("follower.append");
                }
                let r = Reply::Append(raft.append_entries(rpc).await);
                if some {
                    crate::lat::mark("follower.append.done");
                    crate::lat::note("follower.append_entries(with entries)", t0);
                }
                r
            }
            Rpc::Vote(rpc) => match self.refused_vote(envelope.group, &raft) {
                Some(refusal) => Reply::Vote(Ok(refusal)),
                None => Reply::Vote(raft.vote(rpc).await),
            },
            Rpc::PreVote { last_log_id } => {
                let group = envelope.group;
                let own = self.log.with_group(group, |log| log.last_log_id());
                let yes =
                    self.refused_vote(group, &raft).is_none() && self.campaigns.would_vote(group, last_log_id, own);
                Reply::PreVote(yes)
            }
            Rpc::Snapshot { vote, meta, data } => {
                self.campaigns.heard_leader(envelope.group);
                let id = meta.snapshot_id.clone();
                // A stage that is not whole and verified gets no answer: the sender tries again
                // and the transfer resumes; openraft is never asked to install what would fail
                // (an install error stops the group).
                let (files, group) = (self.files.clone(), envelope.group);
                if crate::network::streams_extents(group) {
                    let claim = || claim_stage(&files, group, &id, &data);
                    if self.files.on_disk() { tokio::task::block_in_place(claim) } else { claim() }?;
                }
                let snapshot = openraft::storage::Snapshot { meta, snapshot: Box::new(std::io::Cursor::new(data)) };
                let reply = raft.install_full_snapshot(vote, snapshot).await;
                // Installed, refused, or not newer than what this replica holds (a transfer
                // sent again after a lost answer): its stage serves no more.
                self.files.discard_stage_of(envelope.group, &id);
                self.files.discard_claimed(envelope.group, &id);
                Reply::Snapshot(reply)
            }
            Rpc::FetchPage { page } => Reply::Page(self.copy_for_peer(envelope.group, PageNo(page))),
            Rpc::SnapshotPiece { snapshot_id, total, offset, data, crc } => {
                self.campaigns.heard_leader(envelope.group);
                let files = self.files.clone();
                let group = envelope.group;
                let staged = move || files.receive_piece(group, &snapshot_id, total, offset, &data, crc);
                Reply::Piece(if self.files.on_disk() { tokio::task::block_in_place(staged) } else { staged() })
            }
        })
    }

    /// The leader's write path: whole pages of one chunk compressed here, once, and
    /// replicated; answered once a majority committed the entry and this node applied it.
    pub async fn write_pages(&self, chunk: ChunkId, pages: &[(PageNo, Vec<u8>, Lsn)]) -> Result<(), Error> {
        let raft = self.leader_raft(chunk)?;
        let batch: Vec<(PageNo, &[u8], Lsn, Option<f64>)> =
            pages.iter().map(|(page, content, lsn)| (*page, content.as_slice(), *lsn, None)).collect();
        let command = self.pages_of(chunk).encode_pages(chunk, &batch).map_err(|e| Error::Invalid(e.to_string()))?;
        self.propose(chunk, &raft, Proposal::new(&command)).await
    }

    /// [`Host::write_pages`] on behalf of client request `request` (a nonzero id unique to it).
    /// When `retry` says the request was sent before and its answer was lost, the first attempt
    /// may have taken effect: after waiting for any proposal of it still pending here, the
    /// leader confirms its leadership and applies everything committed (so an entry of the
    /// first attempt is either applied now or can never commit), and answers at once if the
    /// request was applied. A write is thus applied once, however often it is asked.
    pub async fn write_pages_once(
        &self,
        chunk: ChunkId,
        pages: &[(PageNo, Vec<u8>, Lsn)],
        request: u64,
        retry: bool,
    ) -> Result<(), Error> {
        assert!(request != 0, "a request id is never 0");
        let raft = self.leader_raft(chunk)?;
        if retry {
            // A proposal stuck past this long answers with an error of its own first.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            while self.pending.lock().contains(&request) && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            self.read_pages(chunk, &[]).await?;
            if self.requests.contains(chunk, request) {
                return Ok(());
            }
        }
        let t0 = std::time::Instant::now();
        let batch: Vec<(PageNo, &[u8], Lsn, Option<f64>)> =
            pages.iter().map(|(page, content, lsn)| (*page, content.as_slice(), *lsn, None)).collect();
        let command = self.pages_of(chunk).encode_pages(chunk, &batch).map_err(|e| Error::Invalid(e.to_string()))?;
        crate::lat::note("leader.encode(algorithm1)", t0);
        let _pending = Pending::new(&self.pending, request);
        let t1 = std::time::Instant::now();
        crate::lat::mark("propose");
        let r = self.propose(chunk, &raft, Proposal { command: command.encode(), request }).await;
        crate::lat::mark("propose.done");
        crate::lat::note("leader.propose(client_write->applied)", t1);
        r
    }

    /// Heavy compression of `count` pages of one chunk from `first` (seed 000 §3.2.3) through
    /// the group: the leader applies everything committed, reads the pages as applied here,
    /// compresses each segment once and proposes it, and every replica stores the same
    /// segment bytes. A page written or trimmed between the leader's read and its segment's
    /// turn in the log keeps what it has (the store's `put_heavy` takes only pages still at the
    /// version the segment names), so the report counts the pages planned.
    pub async fn heavy_compress(
        &self,
        chunk: ChunkId,
        first: PageNo,
        count: u32,
    ) -> Result<tundra_store::pages::HeavyReport, Error> {
        let raft = self.leader_raft(chunk)?;
        self.read_pages(chunk, &[]).await?;
        let pages = self.pages_of(chunk);
        let plan = || crate::redo_machine::block_in_place_if_multi(|| pages.plan_heavy(chunk, first, count));
        let plans = match plan() {
            // A page whose image went bad here: the range is read again as reads do, which
            // repairs a bad page from a peer, and planned again.
            Err(error) if error.kind() == tundra_store::ErrorKind::Corrupted => {
                for page in first.0..first.0.saturating_add(count) {
                    let page = PageNo(page);
                    if pages
                        .store()
                        .entry(chunk, page)
                        .is_some_and(|e| e.encoding != tundra_store::index::Encoding::Heavy)
                    {
                        self.read_or_repair(&pages, chunk, page).await?;
                    }
                }
                plan()
            }
            other => other,
        }
        .map_err(|e| match e.kind() {
            tundra_store::ErrorKind::Invalid => Error::Invalid(e.to_string()),
            tundra_store::ErrorKind::Corrupted => Error::Corrupted(e.to_string()),
            _ => Error::Unavailable(e.to_string()),
        })?;
        let mut report = tundra_store::pages::HeavyReport::default();
        for plan in plans {
            self.propose(chunk, &raft, Proposal::new(&plan.command)).await?;
            report.add(&plan.report);
        }
        Ok(report)
    }

    /// Removes pages of one chunk through the group.
    pub async fn trim_pages(&self, chunk: ChunkId, pages: Vec<PageNo>) -> Result<(), Error> {
        let raft = self.leader_raft(chunk)?;
        let command = tundra_store::command::StoreCommand::TrimPages { chunk, pages };
        self.propose(chunk, &raft, Proposal::new(&command)).await
    }

    /// A linearizable read on the leader: leadership confirmed by a quorum, everything
    /// committed before the read applied here, then the page read and verified. A leader
    /// never resumes a term after a restart (log/store.rs, `read_vote`), so its read index is
    /// at least its own term's first entry, which follows every write acknowledged before.
    pub async fn read_page(&self, chunk: ChunkId, page: PageNo) -> Result<Option<Vec<u8>>, Error> {
        let mut pages = self.read_pages(chunk, &[page]).await?;
        Ok(pages.pop().flatten())
    }

    /// [`Host::read_page`] of several pages of one chunk after one confirmation of leadership.
    pub async fn read_pages(&self, chunk: ChunkId, pages: &[PageNo]) -> Result<Vec<Option<Vec<u8>>>, Error> {
        let raft = self.leader_raft(chunk)?;
        raft.ensure_linearizable().await.map_err(|e| match e {
            RaftError::APIError(openraft::error::CheckIsLeaderError::ForwardToLeader(f)) => {
                Error::NotLeader { node: self.id, group: chunk.0, leader: f.leader_id }
            }
            other => Error::Unavailable(other.to_string()),
        })?;
        let path = self.pages_of(chunk);
        // The pages together first (one device read for images in consecutive runs); a bad page
        // among them, or any other failure, and they are read one by one, which repairs a bad
        // page from a peer.
        if let Ok(read) = path.read_pages_shared(chunk, pages) {
            return Ok(read.into_iter().map(|page| page.map(|content| content.to_vec())).collect());
        }
        let mut read = Vec::with_capacity(pages.len());
        for &page in pages {
            read.push(self.read_or_repair(&path, chunk, page).await?);
        }
        Ok(read)
    }

    pub(crate) fn pages_of(&self, group: GroupId) -> Arc<Pages> {
        self.paths.lock().get(&group).cloned().unwrap_or_else(|| self.pages.clone())
    }

    /// The group's committed log index as this node last saved it.
    pub fn committed(&self, group: GroupId) -> Option<u64> {
        self.log.with_group(group, |log| log.committed.map(|id| id.index))
    }

    /// The group's Raft if this node believes it leads the group.
    fn leader_raft(&self, chunk: ChunkId) -> Result<Raft, Error> {
        let raft = self.raft(chunk)?;
        let leader = raft.metrics().borrow().current_leader;
        if leader != Some(self.id) {
            return Err(Error::NotLeader { node: self.id, group: chunk.0, leader });
        }
        Ok(raft)
    }

    /// Proposes an entry and answers once it is committed and applied here. A proposal with a
    /// request id is answered by the state machine as it applies the entry
    /// ([`AppliedRequests::wait`]), or by openraft if it answers first (an error: leadership
    /// lost, the group stopped).
    async fn propose(&self, chunk: ChunkId, raft: &Raft, proposal: Proposal) -> Result<(), Error> {
        let request = proposal.request;
        let write = async { raft.client_write(proposal).await.map(|response| response.data.refused) };
        let refused = if request == 0 || answered_by_openraft() {
            write.await
        } else {
            let mut waiting = self.requests.wait(chunk, request);
            tokio::pin!(write);
            let answer = tokio::select! {
                biased;
                refused = &mut waiting.answered => match refused {
                    Ok(refused) => Ok(refused),
                    // Not answered here (never so far): openraft's answer is the one.
                    Err(_) => write.await,
                },
                written = &mut write => written,
            };
            crate::lat::mark("answered");
            answer
        };
        match refused {
            Ok(None) => Ok(()),
            Ok(Some(why)) => Err(Error::Invalid(why)),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Err(Error::NotLeader { node: self.id, group: chunk.0, leader: f.leader_id })
            }
            Err(other) => Err(Error::Unavailable(other.to_string())),
        }
    }

    /// Starts this node's replica of a volume's redo group (`group` is
    /// [`crate::redo_machine::redo_group`] of the volume), applying committed batches through
    /// `applier` and saving its snapshot marks in `marks`; a mark every `logs_per_mark`
    /// entries. Its log is purged only by [`Host::purge_redo_logs`]. A group this host runs
    /// already is left as it is.
    pub async fn add_redo_group(
        &self,
        group: GroupId,
        applier: Arc<dyn crate::redo_machine::RedoApplier>,
        marks: Arc<dyn crate::manager_machine::SnapshotStore>,
        logs_per_mark: u64,
    ) -> Result<(), String> {
        assert!(crate::redo_machine::redo_volume(group).is_some(), "group {:#x} is not a redo group", group.0);
        if self.groups.lock().contains_key(&group) {
            return Ok(());
        }
        // openraft never purges by itself: only below what every voter holds (redo_machine.rs).
        let config = Config {
            snapshot_policy: SnapshotPolicy::LogsSinceLast(logs_per_mark),
            max_in_snapshot_log_to_keep: u64::MAX,
            purge_batch_size: 1,
            ..(*self.config).clone()
        };
        let config = Arc::new(config.validate().map_err(|e| e.to_string())?);
        let machine =
            crate::redo_machine::RedoStateMachine::open(group, applier, marks)?.with_copies(self.files.clone());
        let progress = machine.progress();
        let raft = self.new_raft(group, config, machine).await?;
        self.groups.lock().insert(group, raft);
        self.redo.lock().insert(group, progress);
        Ok(())
    }

    /// The log index every voter of redo group `group` holds, as this node (its leader) knows
    /// from replicating to them: what its next entry tells every replica it may purge below.
    /// 0 when it does not lead or does not know a voter's log yet.
    pub fn redo_held_by_all(&self, group: GroupId) -> u64 {
        let Ok(raft) = self.raft(group) else { return 0 };
        let metrics = raft.metrics().borrow().clone();
        if self.redo_held_committed.load(std::sync::atomic::Ordering::Relaxed) {
            return metrics.last_applied.map_or(0, |id| id.index);
        }
        let Some(replication) = metrics.replication.as_ref() else { return 0 };
        let mut held = u64::MAX;
        for voter in metrics.membership_config.membership().voter_ids() {
            let matched = if voter == self.id {
                metrics.last_applied.map(|id| id.index)
            } else {
                replication.get(&voter).cloned().flatten().map(|id| id.index)
            };
            held = held.min(matched.unwrap_or(0));
        }
        if held == u64::MAX { 0 } else { held }
    }

    /// Purges every redo group's log on this node as far as its replica may (below what every
    /// voter held, less `keep` entries (the node uses [`crate::redo_machine::KEEP_BEHIND`]),
    /// and within its saved mark; the rest waits for the next call). Called now and then by
    /// the node.
    pub async fn purge_redo_logs(&self, keep: u64) {
        let groups: Vec<(GroupId, Arc<Mutex<crate::redo_machine::RedoProgress>>)> =
            self.redo.lock().iter().map(|(g, p)| (*g, p.clone())).collect();
        for (group, progress) in groups {
            let Ok(raft) = self.raft(group) else { continue };
            let (held, marked) = {
                let progress = progress.lock();
                (progress.held_by_all, progress.marked)
            };
            let Some(upto) = held.checked_sub(keep).filter(|&u| u > 0) else { continue };
            let upto = upto.min(marked.unwrap_or(0));
            let purged = raft.metrics().borrow().purged.map_or(0, |id| id.index);
            if upto > purged {
                // Refused only when the group has stopped, which its own calls report.
                let _ = raft.trigger().purge_log(upto).await;
            }
        }
    }

    /// The injected bug of the simulation's twin: redo leaders claim every voter holds what
    /// they applied.
    #[cfg(test)]
    pub(crate) fn redo_held_committed(&self) {
        self.redo_held_committed.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Starts this node's member of the cluster manager's group
    /// ([`crate::manager_machine::manager_group`]) from the snapshot `snapshots` holds, taking
    /// a snapshot (and purging the log behind it) every `logs_per_snapshot` entries. Answers
    /// the member's state, shared; a node that runs the member already answers its state.
    pub async fn add_manager_group(
        &self,
        snapshots: Arc<dyn crate::manager_machine::SnapshotStore>,
        hook: Option<crate::manager_machine::ManagerHook>,
        bug: crate::manager_machine::ManagerBug,
        logs_per_snapshot: u64,
    ) -> Result<Arc<Mutex<crate::manager_machine::ManagerView>>, String> {
        let group = crate::manager_machine::manager_group();
        if let Some(view) = self.manager.lock().clone() {
            return Ok(view);
        }
        let config = Config {
            snapshot_policy: SnapshotPolicy::LogsSinceLast(logs_per_snapshot),
            max_in_snapshot_log_to_keep: logs_per_snapshot / 4,
            purge_batch_size: 1,
            ..(*self.config).clone()
        };
        let config = Arc::new(config.validate().map_err(|e| e.to_string())?);
        let machine = crate::manager_machine::ManagerStateMachine::open(snapshots, hook, bug)?;
        let view = machine.view();
        let raft = self.new_raft(group, config, machine).await?;
        self.groups.lock().insert(group, raft);
        *self.manager.lock() = Some(view.clone());
        Ok(view)
    }

    /// The manager member's state, if this node runs one.
    pub fn manager_view(&self) -> Option<Arc<Mutex<crate::manager_machine::ManagerView>>> {
        self.manager.lock().clone()
    }

    /// Stops this node's member of the manager's group (no longer a member: its place was
    /// given to another node). Its log entries and snapshot stay; nothing in the store changes.
    pub async fn stop_manager_group(&self) -> Result<(), String> {
        let raft = self.take_group(crate::manager_machine::manager_group());
        *self.manager.lock() = None;
        match raft {
            Some(raft) => raft.shutdown().await.map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }

    /// Waits until this node leads `group` and has applied every entry of its log (so its
    /// state is that of everything its log holds, the blank entry of its term included), for up
    /// to `limit`. The redo leader's check of a batch against its own stream comes after it.
    pub async fn settle(&self, group: GroupId, limit: Duration) -> Result<(), Error> {
        let raft = self.leader_raft(group)?;
        let me = self.id;
        let settled = raft
            .wait(Some(limit))
            .metrics(
                |m| m.current_leader == Some(me) && m.last_applied.map(|id| id.index) >= m.last_log_index,
                "every entry of the leader's log applied",
            )
            .await;
        match settled {
            Ok(_) => self.leader_raft(group).map(|_| ()),
            Err(_) => {
                let leader = raft.metrics().borrow().current_leader;
                match leader {
                    Some(node) if node != self.id => Err(Error::NotLeader { node: self.id, group: group.0, leader }),
                    _ => Err(Error::Unavailable(format!("group {:#x} did not settle in {limit:?}", group.0))),
                }
            }
        }
    }

    /// Proposes `entry` to `group` (this node leads it) and answers once a majority holds it
    /// durably and this node applied it.
    pub async fn propose_bytes(&self, group: GroupId, entry: Vec<u8>) -> Result<(), Error> {
        let raft = self.leader_raft(group)?;
        self.propose(group, &raft, Proposal { command: entry, request: 0 }).await
    }

    /// Confirms with a quorum that this node leads `group` and waits until it applied
    /// everything committed before the call: a read after it is linearizable.
    pub async fn linearize(&self, group: GroupId) -> Result<(), Error> {
        self.read_pages(group, &[]).await.map(|_| ())
    }

    /// Stops every group and the log writer; what the writer had not flushed stays unflushed.
    pub async fn shutdown(&self) {
        self.repair.stop_scrub();
        let rafts: Vec<(GroupId, Raft)> = self.groups.lock().iter().map(|(g, r)| (*g, r.clone())).collect();
        for (group, raft) in rafts {
            self.campaigns.stop(group);
            let _ = raft.shutdown().await;
        }
        self.log.stop();
    }
}

/// A request marked pending for as long as its proposal runs (even if the caller gives up on
/// it midway).
struct Pending<'a> {
    set: &'a Mutex<std::collections::HashSet<u64>>,
    request: u64,
}

impl<'a> Pending<'a> {
    fn new(set: &'a Mutex<std::collections::HashSet<u64>>, request: u64) -> Pending<'a> {
        set.lock().insert(request);
        Pending { set, request }
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.set.lock().remove(&self.request);
    }
}

/// Nodes as openraft's node map, for membership changes.
pub fn empty_nodes(ids: &BTreeSet<NodeId>) -> BTreeMap<NodeId, EmptyNode> {
    ids.iter().map(|&id| (id, EmptyNode {})).collect()
}

/// Membership changes that move a chunk's replica from one node to another (seed 000 §4.2:
/// migration, by Raft's own protocol): a learner added on the target and caught up, the voter
/// set changed (openraft's joint consensus), and the source's replica dropped.
impl Host {
    /// On the leader: adds `node` as a learner of `group` and returns once it caught up with
    /// the leader's log as it was when added (from the entries, or from a snapshot of the
    /// chunk's stored images when the leader purged them).
    pub async fn add_learner(&self, group: GroupId, node: NodeId) -> Result<(), Error> {
        let raft = self.leader_raft(group)?;
        raft.add_learner(node, EmptyNode {}, true).await.map(|_| ()).map_err(|e| self.membership_error(group, e))
    }

    /// On the leader: how far `node`'s copy of the group's log matches the leader's (the index
    /// of the last matched entry, None before anything matched), and the leader's last log
    /// index. openraft's blocking `add_learner` gives up waiting for a learner after its
    /// default wait and answers success all the same, so a move checks this itself.
    pub fn replication_of(&self, group: GroupId, node: NodeId) -> Result<(Option<u64>, Option<u64>), Error> {
        let raft = self.leader_raft(group)?;
        let metrics = raft.metrics().borrow().clone();
        let matched = metrics.replication.as_ref().and_then(|r| r.get(&node).cloned().flatten()).map(|id| id.index);
        Ok((matched, metrics.last_log_index))
    }

    /// On the leader: makes `voters` the group's voters; learners not among them are removed
    /// too. One change at a time: openraft refuses a change while another is in progress.
    pub async fn change_voters(&self, group: GroupId, voters: BTreeSet<NodeId>) -> Result<(), Error> {
        let raft = self.leader_raft(group)?;
        raft.change_membership(voters, false).await.map(|_| ()).map_err(|e| self.membership_error(group, e))
    }

    /// On the leader: removes `node` from the group's learners (a move rolled back).
    pub async fn remove_learner(&self, group: GroupId, node: NodeId) -> Result<(), Error> {
        let raft = self.leader_raft(group)?;
        let change = openraft::ChangeMembers::RemoveNodes(BTreeSet::from([node]));
        raft.change_membership(change, false).await.map(|_| ()).map_err(|e| self.membership_error(group, e))
    }

    /// The group's voters and learners as this replica last applied or appended them.
    pub fn members(&self, group: GroupId) -> Result<(BTreeSet<NodeId>, BTreeSet<NodeId>), Error> {
        let raft = self.raft(group)?;
        let metrics = raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership();
        Ok((membership.voter_ids().collect(), membership.learner_ids().collect()))
    }

    /// Why `group`'s membership, as this node has it, is not settled: a joint configuration
    /// (a change between two voter sets under way) or a membership entry not applied here yet
    /// (not known committed). None when it is one voter set, applied: what a catalog may take
    /// as the group's replicas.
    pub fn membership_unsettled(&self, group: GroupId) -> Result<Option<String>, Error> {
        let raft = self.raft(group)?;
        let metrics = raft.metrics().borrow().clone();
        let stored = &metrics.membership_config;
        let configs = stored.membership().get_joint_config();
        if configs.len() > 1 {
            return Ok(Some(format!("group {:#x} is in a joint membership {configs:?}", group.0)));
        }
        let applied = metrics.last_applied.map_or(0, |id| id.index);
        match stored.log_id() {
            Some(at) if at.index > applied => Ok(Some(format!(
                "group {:#x}'s membership at log index {} is not applied yet (applied {applied})",
                group.0, at.index
            ))),
            _ => Ok(None),
        }
    }

    /// Whether this node's log holds anything of `group` (it ran a replica of it once).
    pub fn has_log_of(&self, group: GroupId) -> bool {
        self.log.with_group(group, |log| log.vote.is_some() || log.purged.is_some() || !log.entries.is_empty())
    }

    /// Stops this node's replica of `group` and forgets it ([`Host::forget_group_on`]).
    /// Called only once the group's committed membership no longer names this node (a move
    /// finished or was rolled back).
    pub async fn drop_group(&self, group: GroupId) -> Result<(), String> {
        let raft = self.take_group(group);
        if let Some(raft) = raft {
            raft.shutdown().await.map_err(|e| e.to_string())?;
        }
        let pages = self.pages_of(group);
        self.paths.lock().remove(&group);
        self.forget_group_on(group, pages).await
    }

    /// Forgets a replica of `group` this node no longer runs: its log (entries, purge point
    /// and committed position; the vote stays, [`LogRecord::Reset`]), then the chunk's pages
    /// in `pages`' store and its apply mark (one journal commit). A replica started here again
    /// later starts empty and catches up as a new node's would, so a chunk can move back to a
    /// node that held it. The log goes first: a crash between the two leaves a store that holds
    /// the group up to its apply mark and no log after it, which is what a replica that
    /// installed a snapshot holds, never a log that claims entries the store lost.
    ///
    /// [`LogRecord::Reset`]: crate::log::LogRecord::Reset
    pub async fn forget_group_on(&self, group: GroupId, pages: Arc<Pages>) -> Result<(), String> {
        if self.groups.lock().contains_key(&group) {
            return Err(format!("group {:#x} still runs here; it is stopped before it is forgotten", group.0));
        }
        self.forget_log(group).await?;
        let empty = crate::mark::ApplyMark::default().encode();
        let store = pages.store();
        crate::redo_machine::block_in_place_if_multi(|| store.replace_chunk(group, &[], &empty))
            .map_err(|e| e.to_string())
    }

    /// Stops this node's replica of redo group `group` (a move took it elsewhere, or back) and
    /// forgets its log as [`Host::forget_group_on`] does; the caller drops the stream and mark
    /// the group applied to. A crash in between leaves the mark and stream with no log after
    /// them, which is what a replica that installed a snapshot holds.
    pub async fn drop_redo_group(&self, group: GroupId) -> Result<(), String> {
        assert!(crate::redo_machine::redo_volume(group).is_some(), "group {:#x} is not a redo group", group.0);
        self.redo.lock().remove(&group);
        let raft = self.take_group(group);
        if let Some(raft) = raft {
            raft.shutdown().await.map_err(|e| e.to_string())?;
        }
        self.forget_log(group).await
    }

    /// The log's half of forgetting a replica: `group`'s records reset, durably (skipped under
    /// the twin's bug, [`Host::set_forget_keeps_log`]).
    async fn forget_log(&self, group: GroupId) -> Result<(), String> {
        if self.forget_keeps_log.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        self.log.reset(group).await
    }

    /// Injects a twin's bug: replicas forgotten here keep their logs ([`Host::forget_group_on`]
    /// without its first step). For the tests that show their checks catch it.
    pub fn set_forget_keeps_log(&self, on: bool) {
        self.forget_keeps_log.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    fn membership_error<E: std::fmt::Display>(&self, group: GroupId, error: RaftError<NodeId, E>) -> Error {
        match error {
            RaftError::APIError(api) => {
                let text = api.to_string();
                match self.raft(group).ok().and_then(|r| r.metrics().borrow().current_leader) {
                    Some(leader) if leader != self.id => {
                        Error::NotLeader { node: self.id, group: group.0, leader: Some(leader) }
                    }
                    _ => Error::Unavailable(text),
                }
            }
            other => Error::Unavailable(other.to_string()),
        }
    }
}

/// Whether `group`'s replica is still short of the index it held when it was forgotten here.
/// Started again (a move back), it may first be sent an old snapshot or old entries, whose
/// membership can be the one it was a voter of before it left: campaigning on that, it could
/// win with the vote of a voter as far behind as itself and overwrite entries committed since,
/// with the help of entries it held and lost (the move simulation's seed 50448 did: openraft's
/// own assertion failed on the replica that still held them). With its log past that index it
/// holds every entry a quorum counted it for, and campaigns as any lagging replica may.
fn short_of_held(log: &NodeLog, group: GroupId) -> bool {
    log.reset_held(group).is_some_and(|held| log.last_index(group).is_none_or(|last| last < held))
}

/// Claims a snapshot's staged extents before openraft installs it: a chunk's against its
/// manifest; a redo group's copy against its length and checksum (a mark alone has none).
fn claim_stage(files: &SnapshotFiles, group: GroupId, id: &str, data: &[u8]) -> Result<(), String> {
    if crate::redo_machine::redo_volume(group).is_none() {
        return files.claim(group, id, data);
    }
    match crate::redo_machine::RedoSnapshot::decode(data)? {
        crate::redo_machine::RedoSnapshot::Mark(_) => Ok(()),
        crate::redo_machine::RedoSnapshot::Copy(copy) => files.claim_whole(group, id, copy.copy_len, copy.copy_crc),
    }
}

/// A benchmark's hook: `TUNDRA_TEST_ANSWER_BY_OPENRAFT=1` answers every proposal with
/// openraft's answer alone, as before the state machine answered its own node's proposals
/// (what that saves: bench/results/2026-12-01-answer-from-apply/ab.sh). Unset in production.
fn answered_by_openraft() -> bool {
    static SET: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SET.get_or_init(|| std::env::var("TUNDRA_TEST_ANSWER_BY_OPENRAFT").is_ok_and(|v| v == "1"))
}
