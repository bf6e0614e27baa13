//! One group's view of the node's shared log, as openraft's storage-v2 log interface.

use std::fmt::Debug;
use std::ops::RangeBounds;
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    EmptyNode, Entry, LogId, OptionalSend, RaftLogReader, RaftTypeConfig, SnapshotMeta, StorageError, StorageIOError,
    StoredMembership, Vote,
};
use tokio::sync::oneshot;

use super::{AheadBug, Done, LogRecord, NodeLog};
use crate::types::{GroupId, NodeId, TypeConfig};

/// How long a purge waits for the state machine to reach its purge point.
pub const PURGE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The log of `group` in the node's shared log, on node `me`.
#[derive(Clone)]
pub struct GroupLogStore {
    log: Arc<NodeLog>,
    group: GroupId,
    me: NodeId,
    /// The injected bug of a simulation twin: proposals answered as their entries are appended.
    early_answers: Option<Arc<crate::state_machine::AppliedRequests>>,
}

impl GroupLogStore {
    pub fn new(log: Arc<NodeLog>, group: GroupId, me: NodeId) -> GroupLogStore {
        GroupLogStore { log, group, me, early_answers: None }
    }

    /// Injects a twin's bug: every proposal of this node waiting for its entry
    /// ([`crate::state_machine::AppliedRequests::wait`]) is answered as the entry is appended
    /// here, before a majority holds it; the simulation must catch the acknowledged writes a
    /// crash then loses.
    pub fn answering_early(mut self, requests: Arc<crate::state_machine::AppliedRequests>) -> GroupLogStore {
        self.early_answers = Some(requests);
        self
    }

    /// Whether `entries` may be reported flushed before they are (the module's documentation
    /// in log/mod.rs): this node leads the group under a vote a quorum granted, it proposed
    /// every entry under that vote, and none changes the membership. A follower's append, or
    /// a former leader's entries sent back by a new one, is reported only once durable.
    fn leader_ahead(&self, entries: &[Entry<TypeConfig>]) -> bool {
        if !self.log.ahead() {
            return false;
        }
        let Some(vote) = self.log.with_group(self.group, |log| log.vote) else { return false };
        vote.committed
            && vote.leader_id.node_id == self.me
            && entries.iter().all(|e| {
                e.log_id.leader_id == vote.leader_id && !matches!(e.payload, openraft::EntryPayload::Membership(_))
            })
    }

    fn submit(&self, record: LogRecord, done: Done) -> Result<(), StorageError<NodeId>> {
        self.log.submit(record, done).map_err(|e| StorageIOError::write_logs(openraft::AnyError::error(e)).into())
    }
}

impl RaftLogReader<TypeConfig> for GroupLogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeId>> {
        Ok(self.log.with_group(self.group, |log| log.entries.range(range).map(|(_, e)| e.clone()).collect()))
    }
}

impl RaftLogStorage<TypeConfig> for GroupLogStore {
    type LogReader = GroupLogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        Ok(self
            .log
            .with_group(self.group, |log| LogState { last_purged_log_id: log.purged, last_log_id: log.last_log_id() }))
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    /// Durable on return, as openraft requires of a vote: it waits for the writer's flush,
    /// which other groups' records share.
    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        let (sender, receiver) = oneshot::channel();
        self.submit(LogRecord::Vote { group: self.group, vote: *vote }, Done::Wait(sender))?;
        let result = receiver.await.unwrap_or_else(|_| Err("the node's log writer stopped".into()));
        result.map_err(|e| StorageIOError::write_vote(openraft::AnyError::error(e)).into())
    }

    /// Read once, when the group starts. A vote this node won is read back as not granted: a
    /// leader's own entries are sent before they are durable (log/mod.rs), so a leader that
    /// crashed may restart without entries its followers hold under its term's log ids, and
    /// proposing again in that term would give different entries the same ids (two entries
    /// with one log id break Raft's log matching). It keeps its vote for the term, so it votes
    /// for no one else in it, and must win an election in a later term to lead again.
    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        let resume = self.log.ahead_bug() == AheadBug::ResumeTerm;
        Ok(self.log.with_group(self.group, |log| {
            if let Some(vote) = log.vote.as_mut()
                && vote.committed
                && vote.leader_id.node_id == self.me
                && !resume
            {
                vote.committed = false;
            }
            log.vote
        }))
    }

    /// Not waited for: durable with the next flush. After a crash it may be older than what
    /// the node applied (and acknowledged, as a leader) before; the node leads again only in a
    /// later term (`read_vote`), whose first entry a read waits for, so it never serves a
    /// read from this older index.
    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> Result<(), StorageError<NodeId>> {
        self.submit(LogRecord::Committed { group: self.group, committed }, Done::Nobody)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        Ok(self.log.with_group(self.group, |log| log.committed))
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry<TypeConfig>> = entries.into_iter().collect();
        crate::lat::mark("store.append");
        if let Some(requests) = &self.early_answers {
            for entry in &entries {
                if let openraft::EntryPayload::Normal(proposal) = &entry.payload {
                    requests.answer(self.group, proposal.request, &None);
                }
            }
        }
        if self.leader_ahead(&entries) {
            self.submit(LogRecord::Entries { group: self.group, entries }, Done::Ahead)?;
            callback.log_io_completed(Ok(()));
            return Ok(());
        }
        self.submit(LogRecord::Entries { group: self.group, entries }, Done::Append(callback))
    }

    /// Not waited for: a truncation is durable with the next flush, and the stream's order
    /// keeps it before the entries that replace the ones it removes.
    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.submit(LogRecord::Truncate { group: self.group, since: log_id.index }, Done::Nobody)
    }

    /// No further than the group's applies are durable (its purge guard syncs the store): the
    /// entries are the write-ahead log of applies the store may not have synced. openraft asks
    /// a follower to purge up to a snapshot while its state machine still installs it; the
    /// purge waits for the install (durable at once), for up to [`PURGE_WAIT`], and then
    /// purges only as far as the durable mark's entry, if the log holds it.
    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let failed = |e: String| StorageError::<NodeId>::from(StorageIOError::write_logs(openraft::AnyError::error(e)));
        let deadline = tokio::time::Instant::now() + PURGE_WAIT;
        let allowed = loop {
            let durable = self.log.durable_applied(self.group, log_id).map_err(failed)?;
            match durable {
                Some(durable) if durable >= log_id.index => break Some(log_id),
                _ if tokio::time::Instant::now() >= deadline => {
                    break durable.and_then(|durable| self.log.log_id_at(self.group, durable));
                }
                _ => tokio::time::sleep(std::time::Duration::from_millis(1)).await,
            }
        };
        let Some(log_id) = allowed else { return Ok(()) };
        self.submit(LogRecord::Purge { group: self.group, upto: log_id }, Done::Nobody)
    }
}

/// A group's state machine that applies only entries durable in this node's log: a leader's
/// own appends are reported flushed before they are (log/mod.rs), so openraft may commit an
/// entry whose only durable copies are the followers'; applying it here would answer the
/// client before a majority holds it durably.
pub struct DurableApply<M> {
    machine: M,
    log: Arc<NodeLog>,
    group: GroupId,
}

impl<M> DurableApply<M> {
    pub fn new(machine: M, log: Arc<NodeLog>, group: GroupId) -> DurableApply<M> {
        DurableApply { machine, log, group }
    }
}

type Membership = StoredMembership<NodeId, EmptyNode>;

impl<M: RaftStateMachine<TypeConfig>> RaftStateMachine<TypeConfig> for DurableApply<M> {
    type SnapshotBuilder = M::SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId<NodeId>>, Membership), StorageError<NodeId>> {
        self.machine.applied_state().await
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<<TypeConfig as RaftTypeConfig>::R>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry<TypeConfig>> = entries.into_iter().collect();
        crate::lat::mark("store.apply");
        if let Some(last) = entries.last()
            && self.log.ahead_bug() != AheadBug::ApplyUnflushed
        {
            let t0 = std::time::Instant::now();
            self.log
                .wait_durable(self.group, last.log_id.index)
                .await
                .map_err(|e| StorageError::<NodeId>::from(StorageIOError::write_logs(openraft::AnyError::error(e))))?;
            crate::lat::note("apply.wait_durable", t0);
        }
        self.machine.apply(entries).await
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.machine.get_snapshot_builder().await
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<<TypeConfig as RaftTypeConfig>::SnapshotData>, StorageError<NodeId>> {
        self.machine.begin_receiving_snapshot().await
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, EmptyNode>,
        snapshot: Box<<TypeConfig as RaftTypeConfig>::SnapshotData>,
    ) -> Result<(), StorageError<NodeId>> {
        self.machine.install_snapshot(meta, snapshot).await
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        self.machine.get_current_snapshot().await
    }
}
