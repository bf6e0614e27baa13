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
//! The group's log is the write-ahead log of the applies (as a chunk group's log is of its
//! store's, `state_machine.rs`): an apply need not be durable in the node's redo log when it
//! returns, since its batch is committed, so durable on a majority's logs, and the entry stays
//! in this replica's log until a mark past it is saved. A replica's applies are made durable
//! ([`RedoApplier::sync`]) before a mark that covers them is saved, and the node makes them
//! durable itself before anything else depends on them on its disk (a fold, a spill, a copy).
//!
//! Re-application. After a restart every committed entry past the replica's saved snapshot
//! mark is applied again. That is harmless because the leader proposes a batch only once it
//! has applied every entry of its log and its own stream would accept the batch (the right
//! epoch, `prev_lsn` at its end): so every committed entry was accepted where it was first
//! applied, on every replica alike. Applied again it finds its records in the node's redo log
//! (which answers `Gap` and changes nothing) or, if the crash lost the log's unsynced tail, it
//! is the next batch the log takes: what the log holds is always a prefix of what was applied,
//! and the mark never passes what it holds.
//!
//! Snapshots and purges. A replica's applies are durable once synced, which every saved mark
//! is preceded by, so the group's entries are needed only by a replica that has not applied
//! them yet or whose mark is behind them. The snapshot a replica saves is therefore a mark:
//! "this replica's stream holds every batch up to this log id" ([`RedoMark`], saved to the
//! replica's [`SnapshotStore`] after a sync and before openraft may purge behind it; the
//! host's purge never passes the saved mark). The snapshot it sends another replica (a learner the
//! log was purged past: a replica being moved) is a [`RedoCopy`]: the mark and a copy of its
//! stream as it stands ([`RedoApplier::copy`], written between two applies into the node's
//! snapshot files and streamed as extents, as a chunk's images are), which a replica behind it
//! installs ([`RedoApplier::install`]) and one at or past it does not (a stream never goes
//! back). A copy costs the volume's pages, so no voter should need one: the log is purged only
//! below what every voter holds. The leader writes into each entry the index every voter's log
//! matched when it proposed it (the `held_by_all` of the entry, read through
//! [`RedoApplier::held_by_all`]); each replica keeps the highest it applied and purges its own
//! log no further than that, less [`KEEP_BEHIND`] entries (a new leader probes its followers'
//! logs from an entry it still holds), through [`crate::host::Host::purge_redo_logs`]. openraft
//! never purges a redo group by itself (`max_in_snapshot_log_to_keep` is `u64::MAX`). A replica
//! sent a mark alone (by a sender whose stream cannot be copied) refuses it unless its stream
//! already holds what the mark covers: openraft then stops the group on that node with the
//! reason in its log, rather than let it serve a stream with a hole.

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
use crate::snapshot::SnapshotFiles;
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

    /// Makes every batch applied so far durable in the node's stream. An apply need not be
    /// durable when it returns (the group's log is the write-ahead log of applies, as a chunk
    /// group's is of its store); this is called before anything depends on the applies
    /// locally: before a mark that covers them is saved. An applier whose applies are durable
    /// at once has nothing to do.
    fn sync(&self) -> Result<(), String> {
        Ok(())
    }

    /// The log index every voter held when the leader proposed the entry (0 when the entry
    /// does not say): how far every replica may purge.
    fn held_by_all(&self, entry: &[u8]) -> u64;

    /// Writes a copy of the replica's stream as it stands (called between two applies, so it
    /// is the state the applied log id names) through `out`, in pieces. An applier that cannot
    /// copy its stream answers an error, and its replica's snapshots stay marks.
    fn copy(&self, out: &mut dyn FnMut(&[u8]) -> Result<(), String>) -> Result<(), String> {
        let _ = out;
        Err("this replica's stream cannot be copied".into())
    }

    /// Replaces the replica's stream with the copy of `len` bytes that `read(offset, len)`
    /// gives, all at once and durably, or changes nothing and answers why.
    fn install(&self, len: u64, read: &dyn Fn(u64, usize) -> Result<Vec<u8>, String>) -> Result<(), String> {
        let _ = (len, read);
        Err("this replica's stream cannot be replaced".into())
    }
}

/// The version byte of a saved mark.
const MARK_VERSION: u8 = 1;
/// The version byte of a snapshot that carries a copy of the stream.
const COPY_VERSION: u8 = 2;

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

/// A redo replica's snapshot as sent to another: its mark and the length and crc32c of the
/// copy of its stream that travels as the snapshot's extents (network.rs streams them in
/// pieces, snapshot.rs stages them). Encoded as the version byte 2, the CRC-32C of the rest
/// (u32, little endian), then the postcard encoding of this (docs/format.md, "A redo group's
/// snapshot").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RedoCopy {
    pub mark: RedoMark,
    pub copy_len: u64,
    pub copy_crc: u32,
}

impl RedoCopy {
    pub fn encode(&self) -> Vec<u8> {
        let body = crate::codec::encode(self);
        let mut bytes = vec![COPY_VERSION];
        bytes.extend(crc32c::crc32c(&body).to_le_bytes());
        bytes.extend(body);
        bytes
    }
}

/// A redo snapshot as received: a mark alone (version 1, what every replica sent before
/// copies existed) or a mark with a copy of the stream (version 2).
#[derive(Clone, Debug, PartialEq)]
pub enum RedoSnapshot {
    Mark(RedoMark),
    Copy(RedoCopy),
}

impl RedoSnapshot {
    pub fn decode(bytes: &[u8]) -> Result<RedoSnapshot, String> {
        match bytes.first() {
            Some(&MARK_VERSION) => RedoMark::decode(bytes).map(RedoSnapshot::Mark),
            Some(&COPY_VERSION) => {
                let (crc, body) = bytes[1..].split_at_checked(4).ok_or("a redo snapshot shorter than its header")?;
                let crc = u32::from_le_bytes(crc.try_into().map_err(|_| "a redo snapshot shorter than its header")?);
                if crc32c::crc32c(body) != crc {
                    return Err("a redo snapshot whose checksum does not match".into());
                }
                crate::codec::decode(body).map(RedoSnapshot::Copy)
            }
            Some(version) => Err(format!("a redo snapshot of unknown version {version}")),
            None => Err("an empty redo snapshot".into()),
        }
    }

    pub fn mark(&self) -> &RedoMark {
        match self {
            RedoSnapshot::Mark(mark) => mark,
            RedoSnapshot::Copy(copy) => &copy.mark,
        }
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
    /// Where copies of the stream are written and received; `None`: snapshots are marks.
    files: Option<Arc<SnapshotFiles>>,
    /// Whether openraft asked for the current snapshot since the replica opened (the first
    /// time is its start, which wants the saved mark).
    asked: bool,
    /// The last copy written: its snapshot and the log id it stands for.
    copied: Option<(Option<LogId<NodeId>>, RedoCopy)>,
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
            files: None,
            asked: false,
            copied: None,
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

    /// Snapshots sent to other replicas carry a copy of the stream, written to and received
    /// in `files`.
    pub fn with_copies(mut self, files: Arc<SnapshotFiles>) -> RedoStateMachine {
        self.files = Some(files);
        self
    }

    /// A snapshot of this replica as it stands, with a copy of its stream in the snapshot
    /// files (reused while nothing was applied since); `None` when the stream cannot be
    /// copied, and the snapshot is the saved mark.
    fn copy_here(&mut self) -> Option<Snapshot<TypeConfig>> {
        let files = self.files.clone()?;
        if let Some((at, copy)) = &self.copied
            && *at == self.applied
            && files.extents_len(self.group, &copy.mark.meta.snapshot_id).is_ok_and(|len| len == copy.copy_len)
        {
            let copy = copy.clone();
            return Some(Snapshot { meta: copy.mark.meta.clone(), snapshot: Box::new(Cursor::new(copy.encode())) });
        }
        let mut mark = self.mark_here();
        mark.meta.snapshot_id = format!("copy-{}", mark.meta.snapshot_id);
        let applier = self.applier.clone();
        let write = || files.write_extents(self.group, &mark.meta.snapshot_id, &mut |out| applier.copy(out));
        let written = if files.on_disk() { block_in_place_if_multi(write) } else { write() };
        match written {
            Ok((copy_len, copy_crc)) => {
                let copy = RedoCopy { mark, copy_len, copy_crc };
                self.copied = Some((self.applied, copy.clone()));
                Some(Snapshot { meta: copy.mark.meta.clone(), snapshot: Box::new(Cursor::new(copy.encode())) })
            }
            // The mark is sent instead; a replica behind it refuses it with its own reason.
            Err(_) => None,
        }
    }

    /// Replaces this replica's stream with a copy received whole (claimed in the snapshot
    /// files), then saves the copy's mark: the replica stands where the copy does.
    fn install_copy(&mut self, copy: &RedoCopy) -> Result<(), String> {
        let files = self.files.clone().ok_or("this replica takes no copies of a stream")?;
        let (group, id) = (self.group, copy.mark.meta.snapshot_id.clone());
        let len = files.claimed_len(group, &id)?;
        if len != copy.copy_len {
            return Err(format!("snapshot {id}: {len} of its {} bytes are here", copy.copy_len));
        }
        let read = |offset: u64, n: usize| files.claimed_piece(group, &id, offset, n);
        let applier = self.applier.clone();
        let install = || applier.install(len, &read);
        if files.on_disk() { block_in_place_if_multi(install) } else { install() }?;
        let bytes = copy.mark.encode();
        self.store.save(&bytes)?;
        self.applied = copy.mark.meta.last_log_id;
        self.membership = copy.mark.meta.last_membership.clone();
        let mut progress = self.progress.lock();
        progress.held_by_all = progress.held_by_all.max(copy.mark.held_by_all);
        progress.marked = copy.mark.meta.last_log_id.map(|id| id.index);
        progress.current = Some((copy.mark.clone(), bytes));
        Ok(())
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
    applier: Arc<dyn RedoApplier>,
    store: Arc<dyn SnapshotStore>,
    progress: Arc<Mutex<RedoProgress>>,
}

impl RaftSnapshotBuilder<TypeConfig> for MarkBuilder {
    /// Saved before openraft may purge the entries it covers, and only once every batch it
    /// covers is durable in the node's stream: the applies are synced first (a mark past an
    /// unsynced batch would let a crash lose it for good, since openraft re-applies only the
    /// entries past the mark).
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let bytes = self.mark.encode();
        let applier = self.applier.clone();
        block_in_place_if_multi(|| applier.sync()).map_err(|why| {
            StorageIOError::write_snapshot(
                Some(self.mark.meta.signature()),
                openraft::AnyError::error(format!("redo group {:#x}: syncing before a mark: {why}", self.group.0)),
            )
        })?;
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
            applier: self.applier.clone(),
            store: self.store.clone(),
            progress: self.progress.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<ChunkSnapshot>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    /// A snapshot from another replica. A copy of the stream is installed by a replica behind
    /// it (or empty); a replica at or past it keeps its own stream and takes the mark alone.
    /// A mark alone (the format before copies) is taken only when this replica's stream holds
    /// everything it covers already (then it is this replica's own mark too); otherwise
    /// refused, since the batches it lacks are in no snapshot.
    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, EmptyNode>,
        snapshot: Box<ChunkSnapshot>,
    ) -> Result<(), StorageError<NodeId>> {
        let group = self.group;
        let refuse = |why: String| -> StorageError<NodeId> {
            StorageIOError::write_snapshot(
                Some(meta.signature()),
                openraft::AnyError::error(format!("redo group {:#x}: {why}", group.0)),
            )
            .into()
        };
        let received = RedoSnapshot::decode(&snapshot.into_inner()).map_err(&refuse)?;
        if received.mark().meta != *meta {
            return Err(refuse("a mark whose metadata is not the snapshot's".into()));
        }
        // A replica behind a copy takes it; one at or past it keeps its own stream (it never
        // goes back) and takes the mark alone, as below.
        if let RedoSnapshot::Copy(copy) = &received
            && meta.last_log_id > self.applied
        {
            return self.install_copy(copy).map_err(refuse);
        }
        let mark = received.mark().clone();
        if meta.last_log_id > self.applied {
            return Err(refuse(format!(
                "this replica has applied up to {:?} and was sent a mark at {:?}: the batches between are not \
                 in a mark alone (its sender could not copy its stream), so this replica cannot take it",
                self.applied, meta.last_log_id
            )));
        }
        // The mark covers applies of this replica's own: durable before it is saved.
        let applier = self.applier.clone();
        block_in_place_if_multi(|| applier.sync()).map_err(&refuse)?;
        let bytes = mark.encode();
        self.store.save(&bytes).map_err(refuse)?;
        let mut progress = self.progress.lock();
        progress.held_by_all = progress.held_by_all.max(mark.held_by_all);
        progress.marked = meta.last_log_id.map(|id| id.index);
        progress.current = Some((mark, bytes));
        Ok(())
    }

    /// At the replica's start, the saved mark (openraft wants its metadata); later (openraft
    /// asks to send a snapshot to a replica its log cannot bring up to date), a copy of the
    /// stream as it stands, when the stream can be copied.
    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        let first = !std::mem::replace(&mut self.asked, true);
        if !first && let Some(snapshot) = self.copy_here() {
            return Ok(Some(snapshot));
        }
        Ok(self
            .progress
            .lock()
            .current
            .clone()
            .map(|(mark, bytes)| Snapshot { meta: mark.meta, snapshot: Box::new(Cursor::new(bytes)) }))
    }
}

/// Runs blocking file I/O from a group's task: on a multi-threaded runtime tokio is told.
pub(crate) fn block_in_place_if_multi<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
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

    /// A stream model: batches `(prev, end]`, copied as 16 bytes each.
    #[derive(Default)]
    struct ModelStream(Mutex<Vec<(u64, u64)>>);

    impl RedoApplier for ModelStream {
        fn held_by_all(&self, _entry: &[u8]) -> u64 {
            0
        }

        fn apply(&self, entry: &[u8]) -> Result<Option<String>, String> {
            let prev = u64::from_le_bytes(entry[..8].try_into().unwrap());
            let end = u64::from_le_bytes(entry[8..16].try_into().unwrap());
            let mut batches = self.0.lock();
            let at = batches.last().map_or(0, |b| b.1);
            if prev == at {
                batches.push((prev, end));
                Ok(None)
            } else if end <= at {
                Ok(None)
            } else {
                Ok(Some(format!("({prev}, {end}] on a stream ending at {at}")))
            }
        }

        fn copy(&self, out: &mut dyn FnMut(&[u8]) -> Result<(), String>) -> Result<(), String> {
            for (prev, end) in self.0.lock().iter() {
                out(&[prev.to_le_bytes(), end.to_le_bytes()].concat())?;
            }
            Ok(())
        }

        fn install(&self, len: u64, read: &dyn Fn(u64, usize) -> Result<Vec<u8>, String>) -> Result<(), String> {
            let bytes = read(0, len as usize)?;
            if bytes.len() % 16 != 0 {
                return Err("a copy cut short".into());
            }
            let batches = bytes
                .chunks(16)
                .map(|b| {
                    (u64::from_le_bytes(b[..8].try_into().unwrap()), u64::from_le_bytes(b[8..].try_into().unwrap()))
                })
                .collect();
            *self.0.lock() = batches;
            Ok(())
        }
    }

    fn entry(index: u64, prev: u64, end: u64) -> Entry<TypeConfig> {
        let command = [prev.to_le_bytes(), end.to_le_bytes()].concat();
        Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(crate::types::Proposal { command, request: 0 }),
        }
    }

    /// A replica with its own stream, snapshot store and files; `batches` entries applied.
    async fn replica(batches: u64) -> (RedoStateMachine, Arc<ModelStream>, Arc<SnapshotFiles>) {
        let stream = Arc::new(ModelStream::default());
        let files = Arc::new(SnapshotFiles::in_memory());
        let store = Arc::new(crate::manager_machine::MemSnapshotStore::default());
        let mut machine =
            RedoStateMachine::open(redo_group(4), stream.clone(), store).unwrap().with_copies(files.clone());
        let entries: Vec<_> = (1..=batches).map(|i| entry(i, (i - 1) * 10, i * 10)).collect();
        machine.apply(entries).await.unwrap();
        (machine, stream, files)
    }

    /// The sender's copy, as the transport carries it: the snapshot's data and its extents
    /// staged and claimed at the receiver (`damage` flips a byte of the extents on the way).
    async fn send(
        from: &mut RedoStateMachine,
        from_files: &SnapshotFiles,
        to_files: &SnapshotFiles,
        damage: Option<usize>,
    ) -> (SnapshotMeta<NodeId, EmptyNode>, Vec<u8>, Result<(), String>) {
        // The first ask is the replica's start, which wants its mark.
        let _ = from.get_current_snapshot().await.unwrap();
        let snapshot = from.get_current_snapshot().await.unwrap().expect("a snapshot");
        let data = snapshot.snapshot.into_inner();
        let id = snapshot.meta.snapshot_id.clone();
        let group = redo_group(4);
        let total = from_files.extents_len(group, &id).unwrap();
        let mut extents = from_files.extents_piece(group, &id, 0, total as usize).unwrap();
        if let Some(at) = damage {
            extents[at] ^= 0x40;
        }
        let crc = crc32c::crc32c(&extents);
        assert_eq!(to_files.receive_piece(group, &id, total, 0, &extents, crc), Ok(total));
        let claimed = match RedoSnapshot::decode(&data).unwrap() {
            RedoSnapshot::Copy(copy) => to_files.claim_whole(group, &id, copy.copy_len, copy.copy_crc),
            RedoSnapshot::Mark(_) => panic!("a copy was expected"),
        };
        (snapshot.meta, data, claimed)
    }

    #[test]
    fn a_copy_round_trips_a_mark_still_decodes_and_damage_is_an_error() {
        let log_id = LogId::new(openraft::CommittedLeaderId::new(2, 1), 90);
        let meta = SnapshotMeta {
            last_log_id: Some(log_id),
            last_membership: Default::default(),
            snapshot_id: "copy-2-90".into(),
        };
        let copy = RedoCopy { mark: RedoMark { meta, held_by_all: 40 }, copy_len: 4096, copy_crc: 0xdead_beef };
        let bytes = copy.encode();
        assert_eq!(RedoSnapshot::decode(&bytes), Ok(RedoSnapshot::Copy(copy.clone())));
        let old = copy.mark.encode();
        assert_eq!(RedoSnapshot::decode(&old), Ok(RedoSnapshot::Mark(copy.mark.clone())));
        for at in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x5a;
            assert!(RedoSnapshot::decode(&damaged).is_err(), "byte {at} changed and still decoded");
        }
        for len in 0..bytes.len() {
            assert!(RedoSnapshot::decode(&bytes[..len]).is_err(), "cut at {len}");
        }
        assert!(RedoSnapshot::decode(&[3, 0, 0, 0, 0]).unwrap_err().contains("version 3"));
    }

    #[tokio::test]
    async fn an_empty_replica_installs_a_copy_and_applies_the_next_entries() {
        let (mut source, source_stream, source_files) = replica(6).await;
        let (mut fresh, fresh_stream, fresh_files) = replica(0).await;
        let (meta, data, claimed) = send(&mut source, &source_files, &fresh_files, None).await;
        claimed.unwrap();
        fresh.install_snapshot(&meta, Box::new(Cursor::new(data))).await.unwrap();
        assert_eq!(*fresh_stream.0.lock(), *source_stream.0.lock());
        assert_eq!(fresh.applied_state().await.unwrap().0.map(|id| id.index), Some(6));
        // Its saved mark is the copy's: after a restart it stands there.
        assert_eq!(fresh.progress().lock().marked, Some(6));
        let applied = fresh.apply(vec![entry(7, 60, 70)]).await.unwrap();
        assert_eq!(applied[0].refused, None);
        assert_eq!(fresh_stream.0.lock().last(), Some(&(60, 70)));
    }

    #[tokio::test]
    async fn damaged_copies_are_errors_that_change_nothing() {
        let (mut source, _, source_files) = replica(5).await;
        let (mut fresh, fresh_stream, fresh_files) = replica(0).await;
        // Extents damaged on the way: the claim refuses them, nothing is staged to install.
        let (meta, data, claimed) = send(&mut source, &source_files, &fresh_files, Some(17)).await;
        assert!(claimed.unwrap_err().contains("checksum"));
        let refused = fresh.install_snapshot(&meta, Box::new(Cursor::new(data.clone()))).await;
        assert!(refused.is_err(), "a copy that never arrived whole was installed");
        // The snapshot's own bytes damaged: refused before anything changes.
        let mut damaged = data.clone();
        let last = damaged.len() - 1;
        damaged[last] ^= 1;
        assert!(fresh.install_snapshot(&meta, Box::new(Cursor::new(damaged))).await.is_err());
        assert!(fresh_stream.0.lock().is_empty());
        assert_eq!(fresh.applied_state().await.unwrap().0, None);
        assert_eq!(fresh.progress().lock().marked, None);
    }

    #[tokio::test]
    async fn a_replica_ahead_of_a_copy_keeps_its_stream() {
        let (mut source, _, source_files) = replica(4).await;
        let (mut ahead, ahead_stream, ahead_files) = replica(8).await;
        let before = ahead_stream.0.lock().clone();
        let (meta, data, claimed) = send(&mut source, &source_files, &ahead_files, None).await;
        claimed.unwrap();
        ahead.install_snapshot(&meta, Box::new(Cursor::new(data))).await.unwrap();
        assert_eq!(*ahead_stream.0.lock(), before, "a replica went back to an older copy");
        assert_eq!(ahead.applied_state().await.unwrap().0.map(|id| id.index), Some(8));
    }

    /// The twin of the install test: a copy that leaves out the last batch installs, and the
    /// next entry finds the stream short (the check a replica's stream against the others'
    /// makes in the simulation and the real-process test).
    #[tokio::test]
    async fn a_copy_without_its_last_batch_leaves_the_replica_unable_to_follow() {
        struct Short(Arc<ModelStream>);
        impl RedoApplier for Short {
            fn held_by_all(&self, _entry: &[u8]) -> u64 {
                0
            }
            fn apply(&self, entry: &[u8]) -> Result<Option<String>, String> {
                self.0.apply(entry)
            }
            fn copy(&self, out: &mut dyn FnMut(&[u8]) -> Result<(), String>) -> Result<(), String> {
                let batches = self.0.0.lock().clone();
                for (prev, end) in &batches[..batches.len() - 1] {
                    out(&[prev.to_le_bytes(), end.to_le_bytes()].concat())?;
                }
                Ok(())
            }
        }
        let (mut source, source_stream, source_files) = replica(6).await;
        source.applier = Arc::new(Short(source_stream.clone()));
        let (mut fresh, fresh_stream, fresh_files) = replica(0).await;
        let (meta, data, claimed) = send(&mut source, &source_files, &fresh_files, None).await;
        claimed.unwrap();
        fresh.install_snapshot(&meta, Box::new(Cursor::new(data))).await.unwrap();
        assert_ne!(*fresh_stream.0.lock(), *source_stream.0.lock());
        let applied = fresh.apply(vec![entry(7, 60, 70)]).await.unwrap();
        assert!(applied[0].refused.is_some(), "the short copy went unnoticed");
    }
}
