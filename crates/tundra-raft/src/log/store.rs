//! One group's view of the node's shared log, as openraft's storage-v2 log interface.

use std::fmt::Debug;
use std::ops::RangeBounds;
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{Entry, LogId, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote};
use tokio::sync::oneshot;

use super::{Done, LogRecord, NodeLog};
use crate::types::{GroupId, NodeId, TypeConfig};

/// How long a purge waits for the state machine to reach its purge point.
pub const PURGE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The log of `group` in the node's shared log.
#[derive(Clone)]
pub struct GroupLogStore {
    log: Arc<NodeLog>,
    group: GroupId,
}

impl GroupLogStore {
    pub fn new(log: Arc<NodeLog>, group: GroupId) -> GroupLogStore {
        GroupLogStore { log, group }
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
        Ok(self.log.with_group(self.group, |log| {
            let last = log.entries.values().next_back().map(|e| e.log_id).or(log.purged);
            LogState { last_purged_log_id: log.purged, last_log_id: last }
        }))
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

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        Ok(self.log.with_group(self.group, |log| log.vote))
    }

    /// Not waited for: durable with the next flush. After a crash it may be older than what
    /// the node applied (and acknowledged, as a leader) before; a leader that resumes its term
    /// reads only once it applied its whole log as of its start ([`crate::Host`]'s
    /// `read_pages`), so it never serves a read from this older index.
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
