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
//! Re-application. After a restart every committed entry past the replica's saved snapshot
//! mark is applied again. That is harmless because the leader proposes a batch only once it
//! has applied every entry of its log and its own stream would accept the batch (the right
//! epoch, `prev_lsn` at its end): so every committed entry was accepted where it was first
//! applied, on every replica alike, and applied again it finds its records already in the
//! node's durable redo log, which answers `Gap` and changes nothing.
//!
//! Snapshots and purges. A replica's applies are durable when they return (the node's redo log
//! syncs before it answers), so the group's entries are needed only by a replica that has not
//! applied them yet. A snapshot is therefore a mark, not a copy: "this replica's stream holds
//! every batch up to this log id" ([`RedoMark`], saved to the replica's [`SnapshotStore`] before
//! openraft may purge behind it). Its stream is the node's own; a mark says nothing another
//! node could install. So no replica may ever need a snapshot: the log is purged only below
//! what every voter holds. The leader writes into each entry the index every voter's log
//! matched when it proposed it (the `held_by_all` of the entry, read through
//! [`RedoApplier::held_by_all`]); each replica keeps the highest it applied and purges its own
//! log no further than that, less [`KEEP_BEHIND`] entries (a new leader probes its followers'
//! logs from an entry it still holds), through [`crate::host::Host::purge_redo_logs`]. openraft
//! never purges a redo group by itself (`max_in_snapshot_log_to_keep` is `u64::MAX`). A replica
//! that is sent a mark all the same (its log lost, or a fresh replica, which the cluster does
//! not make for a redo group) refuses it unless its stream already holds what the mark covers:
//! openraft then stops the group on that node with the reason in its log, rather than let it
//! serve a stream with a hole.

use std::io::Cursor;
use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{
    EmptyNode, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, StorageError, StorageIOError,
    StoredMembership,
};
use tundra_store::ids::ChunkId;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::manager_machine::SnapshotStore;
use crate::types::{Applied, ChunkSnapshot, GroupId, NodeId, TypeConfig};

/// How many entries below what every voter holds a replica keeps in its log.
pub const KEEP_BEHIND: u64 = 64;

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

    /// The log index every voter held when the leader proposed the entry (0 when the entry
    /// does not say): how far every replica may purge.
    fn held_by_all(&self, entry: &[u8]) -> u64;
}

/// The version byte of a saved mark.
const MARK_VERSION: u8 = 1;

/// A replica's redo snapshot: every batch up to `meta.last_log_id` is in its node's durable
/// stream, and every voter held the log up to `held_by_all` (docs/format.md, "A redo group's
/// snapshot mark"). Saved as the version byte, the CRC-32C of the rest (u32, little endian),
/// then the postcard encoding of this.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RedoMark {
    pub meta: SnapshotMeta<NodeId, EmptyNode>,
    pub held_by_all: u64,
}

impl RedoMark {
    pub fn encode(&self) -> Vec<u8> {
        let body = crate::codec::encode(self);
        let mut bytes = vec![MARK_VERSION];
        bytes.extend(crc32c::crc32c(&body).to_le_bytes());
        bytes.extend(body);
        bytes
    }

    pub fn decode(bytes: &[u8]) -> Result<RedoMark, String> {
        let (&version, rest) = bytes.split_first().ok_or("an empty redo mark")?;
        if version != MARK_VERSION {
            return Err(format!("a redo mark of unknown version {version}"));
        }
        let (crc, body) = rest.split_at_checked(4).ok_or("a redo mark shorter than its header")?;
        let crc = u32::from_le_bytes(crc.try_into().map_err(|_| "a redo mark shorter than its header")?);
        if crc32c::crc32c(body) != crc {
            return Err("a redo mark whose checksum does not match".into());
        }
        crate::codec::decode(body)
    }
}

/// What a redo replica shares with its host: how far its log may be purged.
#[derive(Default)]
pub struct RedoProgress {
    /// The highest `held_by_all` of an entry it applied (or of its saved mark).
    pub held_by_all: u64,
    /// Its saved mark's last log index.
    pub marked: Option<u64>,
    /// The saved mark and its bytes.
    current: Option<(RedoMark, Vec<u8>)>,
}

/// One volume's redo stream replica as openraft's state machine.
pub struct RedoStateMachine {
    group: GroupId,
    applier: Arc<dyn RedoApplier>,
    applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, EmptyNode>,
    store: Arc<dyn SnapshotStore>,
    progress: Arc<Mutex<RedoProgress>>,
}

impl RedoStateMachine {
    /// A replica as its saved mark left it (nothing applied without one): openraft applies
    /// every committed entry of the log past the mark again at start. A mark that does not
    /// decode stops the replica: the entries before it may be purged.
    pub fn open(
        group: GroupId,
        applier: Arc<dyn RedoApplier>,
        store: Arc<dyn SnapshotStore>,
    ) -> Result<RedoStateMachine, String> {
        let mut machine = RedoStateMachine {
            group,
            applier,
            applied: None,
            membership: StoredMembership::default(),
            store,
            progress: Arc::default(),
        };
        if let Some(bytes) = machine.store.load()? {
            let mark = RedoMark::decode(&bytes).map_err(|why| format!("redo group {:#x}'s mark: {why}", group.0))?;
            machine.applied = mark.meta.last_log_id;
            machine.membership = mark.meta.last_membership.clone();
            *machine.progress.lock() = RedoProgress {
                held_by_all: mark.held_by_all,
                marked: mark.meta.last_log_id.map(|id| id.index),
                current: Some((mark, bytes)),
            };
        }
        Ok(machine)
    }

    /// How far this replica may purge its log, shared with the host.
    pub fn progress(&self) -> Arc<Mutex<RedoProgress>> {
        self.progress.clone()
    }

    fn apply_one(&mut self, entry: &Entry<TypeConfig>) -> Result<Applied, StorageError<NodeId>> {
        let refused = match &entry.payload {
            EntryPayload::Normal(proposal) => {
                let refused = self.applier.apply(&proposal.command).map_err(|why| {
                    StorageIOError::apply(
                        entry.log_id,
                        openraft::AnyError::error(format!("redo group {:#x}: {why}", self.group.0)),
                    )
                })?;
                // Never past the entry before this one: every voter held it only if its own
                // index is below (a hint that says more is a leader's bug, not a reason to
                // purge what a replica may still need).
                let held = self.applier.held_by_all(&proposal.command).min(entry.log_id.index.saturating_sub(1));
                let mut progress = self.progress.lock();
                progress.held_by_all = progress.held_by_all.max(held);
                refused
            }
            EntryPayload::Membership(membership) => {
                self.membership = StoredMembership::new(Some(entry.log_id), membership.clone());
                None
            }
            EntryPayload::Blank => None,
        };
        self.applied = Some(entry.log_id);
        Ok(Applied { refused })
    }

    fn mark_here(&self) -> RedoMark {
        let id = self.applied.map_or("0-0".to_string(), |id| format!("{}-{}", id.leader_id.term, id.index));
        let meta =
            SnapshotMeta { last_log_id: self.applied, last_membership: self.membership.clone(), snapshot_id: id };
        RedoMark { meta, held_by_all: self.progress.lock().held_by_all }
    }
}

/// Saves a replica's mark when openraft builds a snapshot.
pub struct MarkBuilder {
    group: GroupId,
    mark: RedoMark,
    store: Arc<dyn SnapshotStore>,
    progress: Arc<Mutex<RedoProgress>>,
}

impl RaftSnapshotBuilder<TypeConfig> for MarkBuilder {
    /// Saved before openraft may purge the entries it covers; every batch it covers is in the
    /// node's stream already (each apply was durable when it returned).
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let bytes = self.mark.encode();
        self.store.save(&bytes).map_err(|why| {
            StorageIOError::write_snapshot(
                Some(self.mark.meta.signature()),
                openraft::AnyError::error(format!("redo group {:#x}: {why}", self.group.0)),
            )
        })?;
        let mut progress = self.progress.lock();
        progress.marked = self.mark.meta.last_log_id.map(|id| id.index);
        progress.current = Some((self.mark.clone(), bytes.clone()));
        drop(progress);
        Ok(Snapshot { meta: self.mark.meta.clone(), snapshot: Box::new(Cursor::new(bytes)) })
    }
}

impl RaftStateMachine<TypeConfig> for RedoStateMachine {
    type SnapshotBuilder = MarkBuilder;

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
        MarkBuilder {
            group: self.group,
            mark: self.mark_here(),
            store: self.store.clone(),
            progress: self.progress.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<ChunkSnapshot>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    /// A mark from another replica: taken only when this replica's stream holds everything it
    /// covers already (then it is this replica's own mark too); otherwise refused, since the
    /// batches it lacks are in no snapshot (the module's comment).
    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, EmptyNode>,
        snapshot: Box<ChunkSnapshot>,
    ) -> Result<(), StorageError<NodeId>> {
        let refuse = |why: String| -> StorageError<NodeId> {
            StorageIOError::write_snapshot(
                Some(meta.signature()),
                openraft::AnyError::error(format!("redo group {:#x}: {why}", self.group.0)),
            )
            .into()
        };
        let mark = RedoMark::decode(&snapshot.into_inner()).map_err(&refuse)?;
        if mark.meta != *meta {
            return Err(refuse("a mark whose metadata is not the snapshot's".into()));
        }
        if meta.last_log_id > self.applied {
            return Err(refuse(format!(
                "this replica has applied up to {:?} and was sent a mark at {:?}: the batches between are in \
                 no snapshot (a redo replica catches up only from the log, which is purged only below what \
                 every voter holds)",
                self.applied, meta.last_log_id
            )));
        }
        let bytes = mark.encode();
        self.store.save(&bytes).map_err(refuse)?;
        let mut progress = self.progress.lock();
        progress.held_by_all = progress.held_by_all.max(mark.held_by_all);
        progress.marked = meta.last_log_id.map(|id| id.index);
        progress.current = Some((mark, bytes));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        Ok(self
            .progress
            .lock()
            .current
            .clone()
            .map(|(mark, bytes)| Snapshot { meta: mark.meta, snapshot: Box::new(Cursor::new(bytes)) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_round_trips_and_damage_is_an_error() {
        let log_id = LogId::new(openraft::CommittedLeaderId::new(3, 1), 700);
        let meta = SnapshotMeta {
            last_log_id: Some(log_id),
            last_membership: Default::default(),
            snapshot_id: "3-700".into(),
        };
        let mark = RedoMark { meta, held_by_all: 650 };
        let bytes = mark.encode();
        assert_eq!(RedoMark::decode(&bytes), Ok(mark));
        for at in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x5a;
            assert!(RedoMark::decode(&damaged).is_err(), "byte {at} changed and still decoded");
        }
        for len in 0..bytes.len() {
            assert!(RedoMark::decode(&bytes[..len]).is_err(), "cut at {len}");
        }
    }
}
