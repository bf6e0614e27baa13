//! A chunk's replica as openraft's state machine (seed 000 §3.2.1, Figure 4 steps 3.1–3.3
//! and 4): a committed entry's [`StoreCommand`] is applied to the node's store through the
//! page path (so its cache forgets the pages), with the group's apply mark journalled in the
//! same commit. Nothing here compresses: the images are the leader's.
//!
//! Snapshots are a manifest plus extents (snapshot.rs): the chunk's stored images, heavy
//! segments included, copied to the node's snapshot files when openraft asks for a builder
//! (between two applies, so the snapshot is exactly the state at its log id), pushed to the
//! receiver in pieces by [`crate::network::PeerClient`], and installed all or nothing
//! ([`Store::replace_chunk_images`]).

use std::io::Cursor;
use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{
    EmptyNode, Entry, EntryPayload, LogId, OptionalSend, RaftMetrics, RaftSnapshotBuilder, StorageError,
    StorageIOError, StoredMembership,
};
use tundra_store::command::StoreCommand;
use tundra_store::pages::Pages;
use tundra_store::store::{Durability, Store};
use tundra_store::{Error, ErrorKind};

use crate::mark::ApplyMark;
use std::collections::BTreeSet;

use tundra_store::ids::PageNo;
use tundra_store::store::ChunkImage;

use crate::network::Transport;
use crate::repair::Repairer;
use crate::snapshot::{CaptureError, SnapshotFiles};
use crate::types::{Applied, ChunkSnapshot, GroupId, NodeId, TypeConfig};

/// The request ids of the entries each group applied lately, on this node: a leader asked
/// again for a request whose first answer was lost looks here (after confirming its leadership
/// and applying everything committed) before it proposes the request a second time. Kept in
/// memory, the newest [`REQUESTS_KEPT`] per group; a restarted node refills it from the
/// committed entries its log still holds ([`crate::Host::add_group_on`]).
///
/// It also carries the answers of this node's own proposals: a proposal waiting here
/// ([`AppliedRequests::wait`]) is answered by the state machine as it applies the entry
/// ([`AppliedRequests::answer`]), which is what openraft answers too, one task hop later (the
/// state machine's results go back to the Raft core, which answers the proposal).
#[derive(Default)]
pub struct AppliedRequests {
    groups: parking_lot::Mutex<std::collections::HashMap<GroupId, Recent>>,
    waiting: parking_lot::Mutex<std::collections::HashMap<(GroupId, u64), Answer>>,
}

/// The answer to a proposal once its entry is applied here: the reason every replica refused
/// it, if they did.
type Answer = tokio::sync::oneshot::Sender<Option<String>>;

/// A proposal waiting for its entry's apply ([`AppliedRequests::wait`]).
pub struct Waiting<'a> {
    requests: &'a AppliedRequests,
    key: (GroupId, u64),
    /// The answer; an error if it will not come from here (another wait for the same request
    /// took its place).
    pub answered: tokio::sync::oneshot::Receiver<Option<String>>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.requests.waiting.lock().remove(&self.key);
    }
}

/// How many request ids a group remembers.
pub const REQUESTS_KEPT: usize = 65_536;

#[derive(Default)]
struct Recent {
    ids: std::collections::HashSet<u64>,
    order: std::collections::VecDeque<u64>,
}

impl AppliedRequests {
    pub fn record(&self, group: GroupId, request: u64) {
        if request == 0 {
            return;
        }
        let mut groups = self.groups.lock();
        let recent = groups.entry(group).or_default();
        if recent.ids.insert(request) {
            recent.order.push_back(request);
            if recent.order.len() > REQUESTS_KEPT
                && let Some(old) = recent.order.pop_front()
            {
                recent.ids.remove(&old);
            }
        }
    }

    pub fn contains(&self, group: GroupId, request: u64) -> bool {
        self.groups.lock().get(&group).is_some_and(|recent| recent.ids.contains(&request))
    }

    /// Waits for the entry of request `request` (nonzero) to be applied in `group` here, until
    /// the [`Waiting`] is dropped, answered or not (a proposal given up on leaves nothing).
    pub fn wait(&self, group: GroupId, request: u64) -> Waiting<'_> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        self.waiting.lock().insert((group, request), answer);
        Waiting { requests: self, key: (group, request), answered }
    }

    /// Answers a proposal waiting for the entry of `request` just applied in `group`.
    pub(crate) fn answer(&self, group: GroupId, request: u64, refused: &Option<String>) {
        if request == 0 {
            return;
        }
        let waiting = self.waiting.lock().remove(&(group, request));
        if let Some(answer) = waiting {
            crate::lat::mark("answer");
            let _ = answer.send(refused.clone());
        }
    }
}

/// A replica's applies are durable with the store's next journal commit, not before they
/// answer: the group's Raft log, durable on a majority before an entry commits, is their
/// write-ahead log (seed 000 §3.2.1). After a crash openraft applies again the committed
/// entries past the chunk's journalled mark ([`RaftStateMachine::applied_state`]), and the
/// log keeps them until the store synced ([`crate::Host`]'s purge guard). Snapshot installs
/// stay durable at once: openraft purges the log up to the snapshot right after.
const DEFERRED: Durability = Durability::Deferred;

/// Told of every entry (or snapshot) a replica applied, with the store it applied to: the
/// simulation's checkers listen here.
pub type ApplyHook = Arc<dyn Fn(&Store, GroupId, u64) + Send + Sync>;

/// One chunk's replica on one node.
pub struct ChunkStateMachine {
    group: GroupId,
    pages: Arc<Pages>,
    mark: ApplyMark,
    snapshot: Option<(SnapshotMeta<NodeId, EmptyNode>, Vec<u8>)>,
    hook: Option<ApplyHook>,
    requests: Arc<AppliedRequests>,
    node: NodeId,
    files: Arc<SnapshotFiles>,
    /// Repairs the bad pages a capture finds (repair.rs).
    repairer: Repairer,
    /// Who needs a snapshot and can be reached: no capture is made while every follower that
    /// needs one is out of reach.
    pub(crate) reach: SendReach,
    /// Whether openraft has asked for the current snapshot since the replica opened: the first
    /// time is its start, which wants only the snapshot's metadata (see
    /// [`RaftStateMachine::get_current_snapshot`]).
    asked_since_open: bool,
    /// The chunk's images being read ahead of a capture, or read (snapshot.rs `Precopy`).
    ahead: Option<Arc<crate::snapshot::Precopy>>,
}

impl ChunkStateMachine {
    /// The replica of `group` on the store `pages` writes to, where its last journalled mark
    /// says it stands.
    pub fn open(
        group: GroupId,
        pages: Arc<Pages>,
        hook: Option<ApplyHook>,
        requests: Arc<AppliedRequests>,
        (node, files): (NodeId, Arc<SnapshotFiles>),
        repairer: Repairer,
    ) -> Result<ChunkStateMachine, String> {
        let mark = match pages.store().chunk_mark(group) {
            Some(bytes) => ApplyMark::decode(&bytes).map_err(|e| format!("chunk {}: {e}", group.0))?,
            None => ApplyMark::default(),
        };
        Ok(ChunkStateMachine {
            group,
            pages,
            mark,
            snapshot: None,
            hook,
            requests,
            node,
            files,
            repairer,
            reach: SendReach::default(),
            asked_since_open: false,
            ahead: None,
        })
    }

    fn store(&self) -> &Store {
        self.pages.store()
    }

    /// Applies one entry; refusals every replica makes alike are answers, anything else (the
    /// device or journal failed) stops the group.
    fn apply_one(&mut self, entry: &Entry<TypeConfig>) -> Result<Applied, StorageError<NodeId>> {
        let t0 = std::time::Instant::now();
        crate::lat::mark("apply");
        let r = self.apply_one_(entry);
        crate::lat::mark("apply.done");
        crate::lat::note("apply(store commit)", t0);
        r
    }

    fn apply_one_(&mut self, entry: &Entry<TypeConfig>) -> Result<Applied, StorageError<NodeId>> {
        let mut mark = ApplyMark { applied: Some(entry.log_id), membership: self.mark.membership.clone() };
        if let EntryPayload::Membership(membership) = &entry.payload {
            mark.membership = StoredMembership::new(Some(entry.log_id), membership.clone());
        }
        let bytes = mark.encode();
        let command = match &entry.payload {
            EntryPayload::Normal(proposal) => match StoreCommand::decode(&proposal.command) {
                Ok(command) if command.chunk() == Some(self.group) => Ok(command),
                Ok(_) => Err(format!("a command of another chunk than {}", self.group.0)),
                Err(error) => Err(error.to_string()),
            },
            _ => Err(String::new()),
        };
        let result = match &command {
            Ok(command) => self
                .pages
                .apply_command(command, |command| self.pages.store().apply_marked_as(command, &bytes, DEFERRED)),
            Err(_) => self.store().set_chunk_mark_as(self.group, &bytes, DEFERRED),
        };
        let refused = match result {
            Ok(()) => command.err().filter(|why| !why.is_empty()),
            Err(error) if error.kind() == ErrorKind::Invalid => {
                self.store()
                    .set_chunk_mark_as(self.group, &bytes, DEFERRED)
                    .map_err(|e| apply_error(entry.log_id, e))?;
                Some(error.to_string())
            }
            Err(error) => return Err(apply_error(entry.log_id, error)),
        };
        self.mark = mark;
        if let EntryPayload::Normal(proposal) = &entry.payload {
            self.requests.record(self.group, proposal.request);
            self.requests.answer(self.group, proposal.request, &refused);
        }
        if let Some(hook) = &self.hook {
            hook(self.store(), self.group, entry.log_id.index);
        }
        Ok(Applied { refused })
    }

    /// The snapshot metadata of the state as of the current mark; its id names this node and
    /// the log id, then `suffix`.
    fn meta_now(&self, suffix: &str) -> SnapshotMeta<NodeId, EmptyNode> {
        let snapshot_id = match self.mark.applied {
            Some(id) => format!("n{}-t{}.{}-i{}{suffix}", self.node, id.leader_id.term, id.leader_id.node_id, id.index),
            None => format!("n{}-empty{suffix}", self.node),
        };
        SnapshotMeta { last_log_id: self.mark.applied, last_membership: self.mark.membership.clone(), snapshot_id }
    }

    /// The chunk's images copied to the snapshot files, and the manifest (snapshot.rs). The id
    /// names this node and the log id: the same node at the same log id holds the same images.
    /// The pages in `as_stored` are copied as they are stored, unchecked.
    fn capture(
        &self,
        id: &str,
        as_stored: &BTreeSet<PageNo>,
        ahead: Option<&crate::snapshot::Precopy>,
    ) -> Result<Vec<u8>, CaptureError> {
        let (store, pages, group) = (self.store(), &self.pages, self.group);
        let check = |image: &ChunkImage| {
            let first = match image {
                ChunkImage::Page(put) => Some(put.page),
                ChunkImage::Heavy { pages: slots, .. } => slots.first().map(|slot| slot.page),
            };
            if first.is_some_and(|page| as_stored.contains(&page)) { Ok(()) } else { verify(pages, group, image) }
        };
        let capture = || self.files.capture(store, (group, id), self.mark.encode(), &check, ahead);
        let manifest = if self.files.on_disk() { tokio::task::block_in_place(capture) } else { capture() }?;
        Ok(manifest.encode())
    }

    /// [`ChunkStateMachine::capture`], with the bad pages it finds repaired from the other
    /// voters first (seed 000 §3.2.1: three copies, so one bad copy is rewritten from a good
    /// one), then captured again. Applies wait meanwhile: the snapshot is the state between two
    /// applies, and a repair rewrites a page at its own version only (repair.rs).
    ///
    /// A page no voter gives a good copy of is copied as stored when it could be read: its
    /// checksum travels with it, so the receiver's reads find it bad and repair it in turn,
    /// never serve it. A page that cannot be read at all leaves the capture failed, and
    /// openraft stops the group on this node with the reason in its log.
    async fn capture_repairing(&self, id: &str, ahead: Option<&crate::snapshot::Precopy>) -> Result<Vec<u8>, String> {
        let mut as_stored = BTreeSet::new();
        for pass in 0..CAPTURE_PASSES {
            let bad = match self.capture(id, &as_stored, ahead.filter(|_| pass == 0)) {
                Ok(manifest) => return Ok(manifest),
                Err(CaptureError::Failed(why)) => return Err(why),
                Err(CaptureError::BadPages(bad)) => bad,
            };
            let peers: Vec<u64> =
                self.mark.membership.membership().voter_ids().filter(|&voter| voter != self.node).collect();
            for image in bad {
                self.repairer.found_by_snapshot();
                let repaired = self.repairer.repair_page(&self.pages, self.group, image.page, &peers).await;
                match repaired {
                    Ok(_) => {}
                    Err(_) if image.readable => {
                        as_stored.insert(image.page);
                    }
                    Err(error) => {
                        return Err(format!(
                            "chunk {}: page {} cannot be read here ({}) and was not repaired: {error}",
                            self.group.0, image.page.0, image.why
                        ));
                    }
                }
            }
        }
        self.capture(id, &as_stored, None).map_err(|e| format!("chunk {}: {e}", self.group.0))
    }
}

impl ChunkStateMachine {
    /// Whether the chunk's images were read ahead for the capture asked for now, less than
    /// [`READ_AHEAD_FRESH`] ago; if not, they start being read (a blocking task, the group's
    /// applies going on) and openraft is given the mark alone, which sends nothing: the sender
    /// pauses and asks again (network.rs). The images stay for the captures that follow while
    /// they are fresh: under load a follower may need several snapshots before it catches up.
    /// Only for snapshot files on disk (a node's): in the simulation every capture is made at
    /// once, as before. `TUNDRA_TEST_CAPTURE_NO_READ_AHEAD=1` turns it off (a benchmark's
    /// hook).
    fn read_ahead_done(&mut self) -> bool {
        static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let off = *OFF.get_or_init(|| std::env::var("TUNDRA_TEST_CAPTURE_NO_READ_AHEAD").is_ok_and(|v| v == "1"));
        if off || !self.files.on_disk() {
            return true;
        }
        if let Some(ahead) = &self.ahead {
            if !ahead.is_done() {
                return false;
            }
            if ahead.is_fresh(READ_AHEAD_FRESH) {
                return true;
            }
        }
        let ahead = Arc::new(crate::snapshot::Precopy::default());
        self.ahead = Some(ahead.clone());
        let (pages, group) = (self.pages.clone(), self.group);
        tokio::task::spawn_blocking(move || ahead.fill(pages.store(), group, &|image| verify(&pages, group, image)));
        false
    }
}

/// Decompresses `image` of `group` and compares its checksum (a heavy segment's, every page's).
fn verify(pages: &Pages, group: GroupId, image: &ChunkImage) -> tundra_store::Result<()> {
    match image {
        ChunkImage::Page(put) => pages.verify_image(group, put),
        ChunkImage::Heavy { segment, pages: slots } => pages.verify_segment_image(group, segment, slots),
    }
}

/// How long images read ahead serve captures: a page written since is read again under the
/// applies, and under PostgreSQL's load most of a busy chunk's pages are written within
/// seconds.
const READ_AHEAD_FRESH: std::time::Duration = std::time::Duration::from_secs(2);

/// How many times a capture repairs what it found bad and starts again before its last try:
/// a repaired page is good on the next pass unless the media fails again meanwhile.
const CAPTURE_PASSES: usize = 3;

fn apply_error(log_id: LogId<NodeId>, error: Error) -> StorageError<NodeId> {
    StorageIOError::apply(log_id, openraft::AnyError::error(error.to_string())).into()
}

/// What a leader knows of the followers a snapshot would be for: its group's replication
/// progress (set once the group's Raft runs) and which peers its transport reaches.
#[derive(Clone, Default)]
pub(crate) struct SendReach {
    pub(crate) metrics: Arc<std::sync::OnceLock<tokio::sync::watch::Receiver<RaftMetrics<NodeId, EmptyNode>>>>,
    pub(crate) transport: Option<Arc<dyn Transport>>,
}

impl SendReach {
    /// Whether a snapshot asked for now could reach a follower that needs one: false only when
    /// this node leads, some follower's progress is behind the log's purge point (openraft sends
    /// such a follower a snapshot), and every such follower is out of the transport's reach. A
    /// leader whose follower is down asked for a snapshot for it after each purge and captured
    /// the chunk, applies waiting, for a send that could only fail: with a node dead,
    /// PostgreSQL on a replicated mount stood at 0 tps for a second every 4 to 5 s. In any
    /// other case it captures, as before.
    fn worth_capturing(&self, me: NodeId) -> bool {
        let (Some(metrics), Some(transport)) = (self.metrics.get(), &self.transport) else { return true };
        let metrics = metrics.borrow();
        let Some(replication) = &metrics.replication else { return true };
        let purged = metrics.purged.map(|id| id.index);
        let mut needy = replication
            .iter()
            .filter(|&(&peer, matched)| peer != me && matched.map(|id| id.index) < purged)
            .map(|(&peer, _)| peer)
            .peekable();
        needy.peek().is_none() || needy.any(|peer| transport.is_connected(peer))
    }
}

/// A snapshot that is the mark alone: `meta` with an empty manifest, nothing captured. What a
/// build gives, what a replica's start is told, and what a leader answers when no follower
/// that needs a snapshot can be reached ([`PeerClient`](crate::network::PeerClient) never
/// sends it).
fn mark_alone(meta: SnapshotMeta<NodeId, EmptyNode>) -> Snapshot<TypeConfig> {
    Snapshot { meta, snapshot: Box::new(Cursor::new(Vec::new())) }
}

/// A snapshot built for openraft's policy: the mark alone ([`ChunkStateMachine`]'s
/// `get_snapshot_builder`).
pub struct MarkSnapshot {
    meta: SnapshotMeta<NodeId, EmptyNode>,
}

impl RaftSnapshotBuilder<TypeConfig> for MarkSnapshot {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        Ok(mark_alone(self.meta.clone()))
    }
}

impl RaftStateMachine<TypeConfig> for ChunkStateMachine {
    type SnapshotBuilder = MarkSnapshot;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, EmptyNode>), StorageError<NodeId>> {
        Ok((self.mark.applied, self.mark.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Applied>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        entries.into_iter().map(|entry| self.apply_one(&entry)).collect()
    }

    /// A snapshot built for openraft's policy records the mark alone: what it stands for is
    /// already in the store, applied and journalled as the mark says, and building one is what
    /// lets openraft purge the log behind it. The chunk's images are copied only when a snapshot
    /// is to be sent ([`RaftStateMachine::get_current_snapshot`]). Copying them here, every
    /// `LogsSinceLast` entries on every replica, with the group's applies waiting, cost a whole
    /// chunk per thousand writes: PostgreSQL on a replicated mount stood at 0 tps for seconds
    /// at a time while each of its two busy chunks was copied on all three nodes.
    ///
    /// The images captured for a send before are dropped with it (kept on disk for a transfer
    /// still reading them, removed by the next capture): the log may now be purged up to this
    /// mark, so a follower sent an older capture could need entries that are gone. Every
    /// capture is thus at or past the newest built snapshot, and so past every purge.
    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.snapshot = None;
        if self.ahead.as_ref().is_some_and(|ahead| ahead.is_done() && !ahead.is_fresh(READ_AHEAD_FRESH)) {
            self.ahead = None;
        }
        MarkSnapshot { meta: self.meta_now("") }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<ChunkSnapshot>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    /// Installs a snapshot whose extents arrived in pieces (snapshot.rs). The manifest came
    /// over the network: it is decoded with every check, must name this chunk and the mark the
    /// metadata names, and every image is checked against it, before anything changes.
    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, EmptyNode>,
        snapshot: Box<ChunkSnapshot>,
    ) -> Result<(), StorageError<NodeId>> {
        let data = snapshot.into_inner();
        let bad = |why: String| StorageIOError::read_snapshot(Some(meta.signature()), openraft::AnyError::error(why));
        let mark = ApplyMark { applied: meta.last_log_id, membership: meta.last_membership.clone() };
        let sent = crate::snapshot::Manifest::decode(&data).map_err(&bad)?;
        if sent.mark != mark.encode() {
            return Err(bad("a snapshot manifest of another log id or membership than its metadata".into()).into());
        }
        let (files, store, group, id) = (&self.files, self.pages.store(), self.group, &meta.snapshot_id);
        let install = || files.install(store, group, id, &data);
        if files.on_disk() { tokio::task::block_in_place(install) } else { install() }.map_err(&bad)?;
        self.pages.forget_all();
        self.mark = mark;
        // This node holds no extents of the snapshot it received: asked for its current one,
        // it captures its own.
        self.snapshot = None;
        if let (Some(hook), Some(applied)) = (&self.hook, meta.last_log_id) {
            hook(self.store(), self.group, applied.index);
        }
        Ok(())
    }

    /// The snapshot captured last for a send, or one captured now, of the state as of the
    /// current mark (it covers everything the log may have purged, which was applied first;
    /// it may be past the newest snapshot built, which openraft takes as it is). Except at the
    /// replica's start: openraft asks then once, for the metadata it starts from (the log may
    /// be purged behind it), and gets the mark alone, nothing captured. Capturing there would
    /// copy every chunk a node holds at each start, and a single unreadable block of a chunk
    /// would keep the node from starting at all, where it should fail only that page's reads
    /// until repair rewrites it. When a snapshot is to be sent, openraft asks again and the
    /// chunk is captured then.
    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        let first = !std::mem::replace(&mut self.asked_since_open, true);
        if first && self.snapshot.is_none() {
            return Ok(self.mark.applied.map(|_| mark_alone(self.meta_now("-start"))));
        }
        if self.snapshot.is_none() && self.mark.applied.is_some() {
            let meta = self.meta_now("");
            if !self.reach.worth_capturing(self.node) {
                return Ok(Some(mark_alone(meta)));
            }
            if !self.read_ahead_done() {
                return Ok(Some(mark_alone(meta)));
            }
            let ahead = self.ahead.clone();
            let data = self
                .capture_repairing(&meta.snapshot_id, ahead.as_deref())
                .await
                .map_err(|e| StorageIOError::read_state_machine(openraft::AnyError::error(e)))?;
            self.snapshot = Some((meta, data));
        }
        Ok(self.snapshot.clone().map(|(meta, data)| Snapshot { meta, snapshot: Box::new(Cursor::new(data)) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tundra_store::ids::ChunkId;

    #[test]
    fn a_wait_is_answered_by_its_own_request_and_leaves_nothing_when_dropped() {
        let requests = AppliedRequests::default();
        let (group, other) = (ChunkId(7), ChunkId(8));
        let mut waiting = requests.wait(group, 5);
        let given_up = requests.wait(group, 6);
        // Another request, the same request of another group, and no request answer nothing.
        requests.answer(group, 4, &None);
        requests.answer(other, 5, &None);
        requests.answer(group, 0, &None);
        assert!(waiting.answered.try_recv().is_err(), "answered by another entry");
        requests.answer(group, 5, &Some("refused".into()));
        assert_eq!(waiting.answered.try_recv().ok(), Some(Some("refused".to_string())));
        drop(waiting);
        drop(given_up);
        assert!(requests.waiting.lock().is_empty(), "a wait outlived its proposal");
    }
}
