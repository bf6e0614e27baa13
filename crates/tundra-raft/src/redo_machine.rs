//! A replicated volume's redo stream as a Raft group of its own (seed 000 §3.2.1 and §3.3:
//! the writer's redo is durable once a majority holds it; storage applies it to pages): each
//! committed entry is one batch of redo records, and every replica applies it, in log order,
//! to its own node-local redo stream through a [`RedoApplier`], so page versions, log slots
//! and folding happen on every replica from the same records. The group's commit index is the
//! volume's durable LSN: one quorum write per batch, whatever chunks its records touch.
//!
//! The group lives in its own id space ([`redo_group`]: the top bit set, so it never meets a
//! chunk's id) and shares the node's log (and its group commit) and transport with the chunk
//! groups.
//!
//! Re-application. The applied position is not journalled: after a restart every committed
//! entry the log holds is applied again. That is harmless because the leader proposes a batch
//! only once it has applied every entry of its log and its own stream would accept the batch
//! (the right epoch, `prev_lsn` at its end): so every committed entry was accepted where it
//! was first applied, on every replica alike, and applied again it finds its records already
//! in the node's durable redo log, which answers `Gap` and changes nothing.
//!
//! Snapshots are not built: the group never purges its log (`SnapshotPolicy::Never`), so a
//! lagging replica catches up from the entries themselves.

use std::io::Cursor;
use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{
    EmptyNode, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, StorageError, StorageIOError,
    StoredMembership,
};
use tundra_store::ids::ChunkId;

use crate::types::{Applied, ChunkSnapshot, GroupId, NodeId, TypeConfig};

/// The bit that puts a group id in the redo groups' space.
pub const REDO_GROUP_BIT: u64 = 1 << 63;

/// The Raft group of volume `volume`'s redo stream.
pub fn redo_group(volume: u32) -> GroupId {
    ChunkId(REDO_GROUP_BIT | u64::from(volume))
}

/// The volume whose redo stream `group` is, if it is a redo group: the high 32 bits are the
/// top bit alone (the manager's group sets another, `manager_machine.rs`).
pub fn redo_volume(group: GroupId) -> Option<u32> {
    (group.0 >> 32 == REDO_GROUP_BIT >> 32).then_some(group.0 as u32)
}

/// What a node does with a committed redo entry: apply the batch the entry carries to its own
/// stream of the volume.
pub trait RedoApplier: Send + Sync + 'static {
    /// Applies one committed entry's bytes. `Ok(None)`: applied (or, applied again after a
    /// restart, found already there); `Ok(Some(why))`: refused alike on every replica,
    /// nothing changed; `Err`: this node cannot apply it (an I/O error), which stops the group
    /// here. It is called on the group's task and may block (a stream past its memory bound
    /// waits for folding): an applier on a multi-threaded runtime says so to tokio.
    fn apply(&self, entry: &[u8]) -> Result<Option<String>, String>;
}

/// One volume's redo stream replica as openraft's state machine.
pub struct RedoStateMachine {
    group: GroupId,
    applier: Arc<dyn RedoApplier>,
    applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, EmptyNode>,
}

impl RedoStateMachine {
    /// A replica that has applied nothing yet: openraft applies every committed entry of the
    /// log to it again at start.
    pub fn new(group: GroupId, applier: Arc<dyn RedoApplier>) -> RedoStateMachine {
        RedoStateMachine { group, applier, applied: None, membership: StoredMembership::default() }
    }

    fn apply_one(&mut self, entry: &Entry<TypeConfig>) -> Result<Applied, StorageError<NodeId>> {
        let refused = match &entry.payload {
            EntryPayload::Normal(proposal) => self.applier.apply(&proposal.command).map_err(|why| {
                StorageIOError::apply(
                    entry.log_id,
                    openraft::AnyError::error(format!("redo group {:#x}: {why}", self.group.0)),
                )
            })?,
            EntryPayload::Membership(membership) => {
                self.membership = StoredMembership::new(Some(entry.log_id), membership.clone());
                None
            }
            EntryPayload::Blank => None,
        };
        self.applied = Some(entry.log_id);
        Ok(Applied { refused })
    }
}

/// The redo group never builds a snapshot (it never purges its log).
pub struct NoSnapshot;

impl RaftSnapshotBuilder<TypeConfig> for NoSnapshot {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        Err(StorageIOError::read_state_machine(openraft::AnyError::error(
            "a redo group's snapshot is not built: its log is never purged",
        ))
        .into())
    }
}

impl RaftStateMachine<TypeConfig> for RedoStateMachine {
    type SnapshotBuilder = NoSnapshot;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, EmptyNode>), StorageError<NodeId>> {
        Ok((self.applied, self.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Applied>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        entries.into_iter().map(|entry| self.apply_one(&entry)).collect()
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        NoSnapshot
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<ChunkSnapshot>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    /// Never sent (no leader purges a redo group's log): refused without a change.
    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, EmptyNode>,
        _snapshot: Box<ChunkSnapshot>,
    ) -> Result<(), StorageError<NodeId>> {
        Err(StorageIOError::write_snapshot(
            Some(meta.signature()),
            openraft::AnyError::error("a redo group installs no snapshot: its log is never purged"),
        )
        .into())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        Ok(None)
    }
}
