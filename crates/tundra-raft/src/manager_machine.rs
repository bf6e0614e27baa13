//! The cluster manager's own Raft group (seed 000 §4.2: the manager that places chunks and
//! schedules moves survives a node's death): each committed entry is one encoded
//! [`tundra_cluster::Command`], and every member applies it, in log order, to its copy of the
//! [`ClusterState`]. `ClusterState::apply` is a pure function of the state and the command, and
//! a refused command changes nothing, so every member holds the same state after the same log
//! and answers a refusal alike.
//!
//! The group's id is [`manager_group`]: the redo groups' top bit and the next one set, so it
//! meets neither a chunk's id (volume ids are 32-bit) nor a redo group's (`1 << 63 | volume`).
//!
//! Snapshots. Unlike a redo group, the manager's log is purged: a snapshot is the encoded state
//! (tundra-cluster's `codec.rs`), captured between two applies, saved durably through a
//! [`SnapshotStore`] before openraft may purge the entries it covers, and installed whole on a
//! member that fell behind the leader's purged log (decoded with every check first; a snapshot
//! that does not decode changes nothing). A member that restarts starts from its saved snapshot
//! and openraft applies the committed entries the log holds past it again: the state is rebuilt
//! exactly, since applying is deterministic.

use std::io::Cursor;
use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{
    EmptyNode, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, StorageError, StorageIOError,
    StoredMembership,
};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tundra_cluster::{ClusterState, Command, ManagerConfig, Policy};
use tundra_store::ids::ChunkId;

use crate::redo_machine::REDO_GROUP_BIT;
use crate::types::{Applied, ChunkSnapshot, GroupId, NodeId, TypeConfig};

/// The bit that, with [`REDO_GROUP_BIT`], names the manager's group.
pub const MANAGER_GROUP_BIT: u64 = 1 << 62;

/// The cluster manager's Raft group.
pub fn manager_group() -> GroupId {
    ChunkId(REDO_GROUP_BIT | MANAGER_GROUP_BIT)
}

/// Whether `group` is a chunk's group: neither a volume's redo group nor the manager's.
pub fn is_chunk_group(group: GroupId) -> bool {
    crate::redo_machine::redo_volume(group).is_none() && group != manager_group()
}

/// The configuration a member's state starts from before any `Configure`: the same on every
/// member, so that the first commands apply alike.
pub fn genesis_config() -> ManagerConfig {
    ManagerConfig::paper(Policy::Logical)
}

/// Where a member keeps its latest snapshot: durable once `save` returns, replaced whole (a
/// crash leaves the old snapshot or the new one).
pub trait SnapshotStore: Send + Sync + 'static {
    fn load(&self) -> Result<Option<Vec<u8>>, String>;
    fn save(&self, bytes: &[u8]) -> Result<(), String>;
}

/// A snapshot store in memory (the simulation keeps one per node across its crashes).
#[derive(Default)]
pub struct MemSnapshotStore(Mutex<Option<Vec<u8>>>);

impl SnapshotStore for MemSnapshotStore {
    fn load(&self) -> Result<Option<Vec<u8>>, String> {
        Ok(self.0.lock().clone())
    }
    fn save(&self, bytes: &[u8]) -> Result<(), String> {
        *self.0.lock() = Some(bytes.to_vec());
        Ok(())
    }
}

/// The version byte of a saved snapshot.
const SAVED_VERSION: u8 = 1;

/// A saved snapshot: its Raft metadata and the encoded state (docs/format.md, "The cluster
/// manager's snapshot file"). Saved as the version byte, the CRC-32C of the rest (u32, little
/// endian), then the postcard encoding of this.
#[derive(Serialize, Deserialize)]
struct Saved {
    meta: SnapshotMeta<NodeId, EmptyNode>,
    #[serde(with = "crate::codec::bytes")]
    state: Vec<u8>,
}

fn encode_saved(meta: &SnapshotMeta<NodeId, EmptyNode>, state: &[u8]) -> Vec<u8> {
    let body = crate::codec::encode(&Saved { meta: meta.clone(), state: state.to_vec() });
    let mut bytes = vec![SAVED_VERSION];
    bytes.extend(crc32c::crc32c(&body).to_le_bytes());
    bytes.extend(body);
    bytes
}

/// A saved snapshot's metadata, its encoded state, and the state.
type Loaded = (SnapshotMeta<NodeId, EmptyNode>, Vec<u8>, ClusterState);

fn decode_saved(bytes: &[u8]) -> Result<Loaded, String> {
    let (&version, rest) = bytes.split_first().ok_or("an empty manager snapshot")?;
    if version != SAVED_VERSION {
        return Err(format!("a manager snapshot of unknown version {version}"));
    }
    let (crc, body) = rest.split_at_checked(4).ok_or("a manager snapshot shorter than its header")?;
    let crc = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
    if crc32c::crc32c(body) != crc {
        return Err("a manager snapshot whose checksum does not match".into());
    }
    let saved: Saved = crate::codec::decode(body)?;
    let state = ClusterState::decode(&saved.state).map_err(|e| e.to_string())?;
    Ok((saved.meta, saved.state, state))
}

/// What a member has applied, shared with the node that reads it (the leader's decisions, the
/// status).
pub struct ManagerView {
    pub state: ClusterState,
    pub applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, EmptyNode>,
    /// The latest snapshot, saved.
    current: Option<(SnapshotMeta<NodeId, EmptyNode>, Vec<u8>)>,
}

/// Told of every command entry a member applies: its log index and bytes (the simulation's
/// checker compares them across members).
pub type ManagerHook = Arc<dyn Fn(u64, &[u8]) + Send + Sync>;

/// A bug injected in tests to show that the checkers catch a member whose state diverges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ManagerBug {
    None,
    /// The member skips one command entry in ten (as a nondeterministic apply would diverge).
    SkipSome,
}

/// One member of the manager group as openraft's state machine.
pub struct ManagerStateMachine {
    view: Arc<Mutex<ManagerView>>,
    store: Arc<dyn SnapshotStore>,
    hook: Option<ManagerHook>,
    bug: ManagerBug,
}

impl ManagerStateMachine {
    /// A member as its saved snapshot left it (the genesis state without one). A saved snapshot
    /// that does not decode stops the member: its entries may be purged from the log.
    pub fn open(
        store: Arc<dyn SnapshotStore>,
        hook: Option<ManagerHook>,
        bug: ManagerBug,
    ) -> Result<ManagerStateMachine, String> {
        let genesis = ClusterState::new(genesis_config()).map_err(|e| e.to_string())?;
        let mut view = ManagerView { state: genesis, applied: None, membership: Default::default(), current: None };
        if let Some(bytes) = store.load()? {
            let (meta, encoded, state) =
                decode_saved(&bytes).map_err(|why| format!("the manager's snapshot: {why}"))?;
            view.state = state;
            view.applied = meta.last_log_id;
            view.membership = meta.last_membership.clone();
            view.current = Some((meta, encoded));
        }
        Ok(ManagerStateMachine { view: Arc::new(Mutex::new(view)), store, hook, bug })
    }

    /// The member's state, shared.
    pub fn view(&self) -> Arc<Mutex<ManagerView>> {
        self.view.clone()
    }

    fn apply_one(&mut self, entry: &Entry<TypeConfig>) -> Applied {
        let mut view = self.view.lock();
        let refused = match &entry.payload {
            EntryPayload::Normal(proposal) => {
                if let Some(hook) = &self.hook {
                    hook(entry.log_id.index, &proposal.command);
                }
                if self.bug == ManagerBug::SkipSome && entry.log_id.index % 10 == 3 {
                    None
                } else {
                    match Command::decode(&proposal.command) {
                        Ok(command) => view.state.apply(&command).err().map(|e| e.to_string()),
                        Err(e) => Some(e.to_string()),
                    }
                }
            }
            EntryPayload::Membership(membership) => {
                view.membership = StoredMembership::new(Some(entry.log_id), membership.clone());
                None
            }
            EntryPayload::Blank => None,
        };
        view.applied = Some(entry.log_id);
        Applied { refused }
    }
}

/// A snapshot captured between two applies, saved when built.
pub struct ManagerSnapshot {
    meta: SnapshotMeta<NodeId, EmptyNode>,
    state: Vec<u8>,
    view: Arc<Mutex<ManagerView>>,
    store: Arc<dyn SnapshotStore>,
}

impl RaftSnapshotBuilder<TypeConfig> for ManagerSnapshot {
    /// Saves the snapshot before openraft may purge the entries it covers.
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let saved = encode_saved(&self.meta, &self.state);
        self.store.save(&saved).map_err(|why| {
            StorageIOError::write_snapshot(Some(self.meta.signature()), openraft::AnyError::error(why))
        })?;
        self.view.lock().current = Some((self.meta.clone(), self.state.clone()));
        Ok(Snapshot { meta: self.meta.clone(), snapshot: Box::new(Cursor::new(self.state.clone())) })
    }
}

impl RaftStateMachine<TypeConfig> for ManagerStateMachine {
    type SnapshotBuilder = ManagerSnapshot;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, EmptyNode>), StorageError<NodeId>> {
        let view = self.view.lock();
        Ok((view.applied, view.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Applied>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        Ok(entries.into_iter().map(|entry| self.apply_one(&entry)).collect())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        let view = self.view.lock();
        let id = view.applied.map_or("0-0".to_string(), |id| format!("{}-{}", id.leader_id.term, id.index));
        let meta =
            SnapshotMeta { last_log_id: view.applied, last_membership: view.membership.clone(), snapshot_id: id };
        ManagerSnapshot { meta, state: view.state.encode(), view: self.view.clone(), store: self.store.clone() }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<ChunkSnapshot>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    /// Installs a state sent whole by the leader: decoded with every check and saved before
    /// anything changes here.
    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, EmptyNode>,
        snapshot: Box<ChunkSnapshot>,
    ) -> Result<(), StorageError<NodeId>> {
        let data = snapshot.into_inner();
        let state = ClusterState::decode(&data).map_err(|e| {
            StorageIOError::read_snapshot(Some(meta.signature()), openraft::AnyError::error(e.to_string()))
        })?;
        self.store
            .save(&encode_saved(meta, &data))
            .map_err(|why| StorageIOError::write_snapshot(Some(meta.signature()), openraft::AnyError::error(why)))?;
        let mut view = self.view.lock();
        view.state = state;
        view.applied = meta.last_log_id;
        view.membership = meta.last_membership.clone();
        view.current = Some((meta.clone(), data));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        let view = self.view.lock();
        Ok(view.current.clone().map(|(meta, data)| Snapshot { meta, snapshot: Box::new(Cursor::new(data)) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manager_group_meets_no_chunk_and_no_redo_group() {
        let group = manager_group();
        assert_eq!(crate::redo_machine::redo_volume(group), None);
        for volume in [0, 1, u32::MAX] {
            assert_ne!(crate::redo_machine::redo_group(volume), group);
            assert_ne!(ChunkId::new(tundra_store::ids::VolumeId(volume), u32::MAX), group);
        }
    }

    #[test]
    fn a_saved_snapshot_round_trips_and_damage_is_an_error() {
        let state = ClusterState::new(genesis_config()).unwrap();
        let meta = SnapshotMeta { last_log_id: None, last_membership: Default::default(), snapshot_id: "0-0".into() };
        let bytes = encode_saved(&meta, &state.encode());
        assert_eq!(decode_saved(&bytes).unwrap().2, state);
        for at in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x5a;
            assert!(decode_saved(&damaged).is_err(), "byte {at} changed and still decoded");
        }
        for len in 0..bytes.len() {
            assert!(decode_saved(&bytes[..len]).is_err());
        }
    }
}
