//! A replicated volume's redo stream (seed 000 §2.1, §3.2.1, §3.3), through its own Raft group
//! (tundra-raft's `redo_machine`): appends, reads at an LSN, reader leases and the stream's
//! status on any node are sent to the group's leader ([`ClusterNode::redo_request`]), which
//! serves them with its node-local stream.
//!
//! - An append: the leader, one batch of a volume at a time, waits until it has applied every
//!   entry of its log, checks the batch against its own stream (the writer's epoch, `prev_lsn`
//!   at the stream's end: `Fenced` and `Gap` are answered without a proposal), proposes the
//!   batch as one entry and answers `Ok` once a majority holds it and it applied it. Every
//!   replica applies the entry to its node-local stream ([`NodeApplier`]), so the volume's
//!   durable LSN is the group's commit.
//! - A read at an LSN, the status, a lease: the leader confirms its leadership with a quorum,
//!   applies everything committed, and answers from its stream as a node alone does. Leases
//!   live on the leader: a new leader starts without them (their renewals answer
//!   `LEASE_LOST`, and the reader resyncs), as a restarted node alone does.
//!
//! A batch whose answer was lost (its leader died) and that is sent again finds itself in the
//! stream: the new leader answers `Gap` with `expected_prev_lsn` at or past its `end_lsn`,
//! which tells its writer the batch is durable, as a node alone answers a duplicate.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tundra_node::Node;
use tundra_node::native::NodeService;
use tundra_proto::{ReadAt, Service, ServiceError, Status};
use tundra_raft::redo_machine::{RedoApplier, redo_group};
use tundra_store::ids::VolumeId;

use crate::cluster::ClusterNode;
use crate::messages::{Answer, Forward, Refusal};

/// How long a leader waits to have applied its whole log before it checks a batch.
const SETTLE_LIMIT: Duration = Duration::from_secs(10);
/// The pause between two tries of a batch the node's stream cannot take yet.
const APPLY_RETRY: Duration = Duration::from_millis(20);

/// The version byte of a redo group's entry: 2 puts before the batch the log index every
/// voter held when the leader proposed it; 1 (still read) has the batch alone.
const ENTRY_VERSION: u8 = 2;
const ENTRY_VERSION_1: u8 = 1;

/// Entries between two snapshot marks of a redo group (tundra-raft's `redo_machine`).
pub const LOGS_PER_MARK: u64 = 256;
/// How often a node purges its redo groups' logs behind what every voter holds.
const PURGE_EVERY: Duration = Duration::from_secs(1);

/// A redo group's log entry: one batch of a volume's writer, as it sent it (docs/format.md,
/// "The Raft log": a version byte, for version 2 the `held_by_all` index as a little-endian
/// u64, then the postcard encoding of these fields).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedoEntry {
    pub volume: u32,
    pub epoch: u64,
    pub prev_lsn: u64,
    pub end_lsn: u64,
    pub record_count: u32,
    pub records: Vec<u8>,
}

impl RedoEntry {
    /// The entry as logged, with the index every voter holds (`held_by_all`).
    pub fn encode(&self, held_by_all: u64) -> Vec<u8> {
        let mut bytes = vec![ENTRY_VERSION];
        bytes.extend(held_by_all.to_le_bytes());
        bytes.extend(postcard::to_allocvec(self).expect("an entry encodes"));
        bytes
    }

    /// The entry in `bytes` and its `held_by_all` (0 for version 1), every length checked
    /// against the bytes there are.
    pub fn decode(bytes: &[u8]) -> Result<(RedoEntry, u64), String> {
        let (held, rest) = match bytes.split_first() {
            Some((&ENTRY_VERSION, rest)) => {
                let (held, rest) = rest.split_at_checked(8).ok_or("a redo entry shorter than its header")?;
                (u64::from_le_bytes(held.try_into().map_err(|_| "a redo entry shorter than its header")?), rest)
            }
            Some((&ENTRY_VERSION_1, rest)) => (0, rest),
            Some((version, _)) => return Err(format!("a redo entry of unknown version {version}")),
            None => return Err("an empty redo entry".into()),
        };
        match postcard::take_from_bytes::<RedoEntry>(rest) {
            Ok((entry, [])) => Ok((entry, held)),
            Ok((_, trailing)) => Err(format!("a redo entry followed by {} stray bytes", trailing.len())),
            Err(e) => Err(format!("a redo entry that does not decode: {e}")),
        }
    }
}

/// A redo group's snapshot marks, one file per volume in the node's data directory.
pub fn mark_file(data_dir: &std::path::Path, volume: u32) -> std::path::PathBuf {
    data_dir.join(format!("redo-{volume}.mark"))
}

/// What a node asks of a volume's redo leader.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum RedoCall {
    Append(RedoEntry),
    Status,
    Read { pages: Vec<u64>, request_lsn: u64, not_modified_since: u64, lease: Option<u64> },
    Register { reader: u64, start_lsn: u64 },
    Renew { lease: u64, apply_lsn: u64 },
    Release { lease: u64 },
}

/// The redo leader's answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum RedoReply {
    /// 0 ok (the durable LSN), 1 gap (the expected previous LSN), 2 fenced (the epoch).
    Appended {
        code: u8,
        value: u64,
    },
    Status {
        writer_epoch: u64,
        durable_lsn: u64,
        complete_lsn: u64,
        lsn_min: u64,
    },
    Pages {
        served_lsn: u64,
        page_lsns: Vec<u64>,
        data: Vec<u8>,
    },
    Lease {
        lease_id: u64,
        granted_lsn: u64,
        valid_for_ms: u64,
    },
    Renewed {
        valid_for_ms: u64,
        lsn_min: u64,
    },
    Released,
    /// The leader's node refused, as a node alone would: its status code, message and LSN.
    Refused {
        code: u16,
        message: String,
        lsn: Option<u64>,
    },
}

impl RedoReply {
    fn refused(error: ServiceError) -> RedoReply {
        RedoReply::Refused { code: error.code.code(), message: error.message, lsn: error.lsn }
    }

    /// The answer as the native protocol's result.
    pub fn into_result(self) -> Result<RedoReply, ServiceError> {
        match self {
            RedoReply::Refused { code, message, lsn } => {
                let code = Status::from_code(code).filter(|c| *c != Status::Ok).unwrap_or(Status::Internal);
                Err(ServiceError { code, message, lsn })
            }
            other => Ok(other),
        }
    }
}

/// One node's replica of one volume's redo stream: applies the group's committed batches.
pub struct NodeApplier {
    pub node: Arc<Node>,
    pub volume: u32,
}

impl NodeApplier {
    /// Read from the header alone: the batch is decoded once, by `apply`.
    fn held_by_all_of(entry: &[u8]) -> u64 {
        match entry.split_first() {
            Some((&ENTRY_VERSION, rest)) => rest.get(..8).and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes),
            _ => 0,
        }
    }
}

impl RedoApplier for NodeApplier {
    fn held_by_all(&self, entry: &[u8]) -> u64 {
        NodeApplier::held_by_all_of(entry)
    }

    /// The applies so far made durable in the node's redo log (tundra-node's `redo_sync`):
    /// called before a mark is saved.
    fn sync(&self) -> Result<(), String> {
        self.node.redo_sync(VolumeId(self.volume)).map_err(|e| e.to_string())
    }

    /// The volume's images and the stream's batches (tundra-node's `redo_copy`, which syncs
    /// the stream first).
    fn copy(&self, out: &mut dyn FnMut(&[u8]) -> Result<(), String>) -> Result<(), String> {
        self.node.redo_copy(VolumeId(self.volume), out, test_copy_bug()).map(|_| ()).map_err(|e| e.to_string())
    }

    /// The copy replaces this node's stream and the volume's images (tundra-node's
    /// `redo_install`); a chunk this node runs no group of gets an empty apply mark.
    fn install(&self, len: u64, read: &dyn Fn(u64, usize) -> Result<Vec<u8>, String>) -> Result<(), String> {
        let empty = tundra_raft::mark::ApplyMark::default().encode();
        self.node.redo_install(VolumeId(self.volume), len, read, &empty).map(|_| ()).map_err(|e| e.to_string())
    }

    fn apply(&self, entry: &[u8]) -> Result<Option<String>, String> {
        let entry = match RedoEntry::decode(entry) {
            Ok((entry, _)) if entry.volume == self.volume => entry,
            Ok((entry, _)) => {
                return Ok(Some(format!("a batch of volume {} in the group of {}", entry.volume, self.volume)));
            }
            Err(why) => return Ok(Some(why)),
        };
        let volume = match self.node.volume(VolumeId(self.volume)) {
            Ok(volume) => volume,
            Err(e) => return Ok(Some(e.to_string())),
        };
        // Deferred: the group's log is the write-ahead log of its applies (tundra-raft's
        // `redo_machine`), so the batch, committed on a majority, need not wait for the node's
        // redo log to sync; `sync` catches up before a mark, and the node before it folds,
        // spills or copies.
        let synced = test_apply_synced();
        let append = || {
            let (epoch, prev, end, count) = (entry.epoch, entry.prev_lsn, entry.end_lsn, entry.record_count);
            if synced {
                self.node.append_redo(&volume, epoch, prev, end, count, &entry.records)
            } else {
                self.node.append_redo_deferred(&volume, epoch, prev, end, count, &entry.records)
            }
        };
        loop {
            let t0 = std::time::Instant::now();
            let result = match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
                Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(append),
                _ => append(),
            };
            tundra_raft::lat::note("redo.apply(append_redo)", t0);
            return match result {
                // Applied, or (applied again after a restart) found there already.
                Ok(_) => Ok(None),
                // Memory past its bound or a full log: readers hold folding back. Every
                // replica must take the batch, so this one waits its turn.
                Err(tundra_node::Error::Busy(_) | tundra_node::Error::NoSpace(_)) => {
                    std::thread::sleep(APPLY_RETRY);
                    continue;
                }
                Err(tundra_node::Error::Invalid(why)) => Ok(Some(why)),
                Err(error) if !volume.is_live() => Ok(Some(error.to_string())),
                Err(error) => Err(error.to_string()),
            };
        }
    }
}

/// A benchmark-only hook: `TUNDRA_TEST_REDO_APPLY_SYNCED=1` makes every apply wait for the
/// node-local redo log's sync, as applies did before the group's log became their write-ahead
/// log (cluster_redo_bench's baseline, measured in the same round). Safe either way; unset in
/// production.
fn test_apply_synced() -> bool {
    static SYNCED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SYNCED.get_or_init(|| std::env::var("TUNDRA_TEST_REDO_APPLY_SYNCED").is_ok_and(|v| v == "1"))
}

/// A test-only hook: `TUNDRA_TEST_REDO_COPY_BUG=drop-last-batch` makes every copy of a redo
/// stream this node sends leave out its last batch, for the twin of the drain test. Unset in
/// production.
fn test_copy_bug() -> tundra_node::CopyBug {
    match std::env::var("TUNDRA_TEST_REDO_COPY_BUG").as_deref() {
        Ok("drop-last-batch") => tundra_node::CopyBug::DropLastBatch,
        _ => tundra_node::CopyBug::None,
    }
}

/// One batch of a volume at a time on its leader: the check against the stream and the
/// proposal are one step.
#[derive(Default)]
pub(crate) struct RedoTurns {
    volumes: parking_lot::Mutex<HashMap<u32, Arc<tokio::sync::Mutex<()>>>>,
}

impl RedoTurns {
    fn of(&self, volume: u32) -> Arc<tokio::sync::Mutex<()>> {
        self.volumes.lock().entry(volume).or_default().clone()
    }
}

fn refusal(error: tundra_raft::Error) -> Refusal {
    match error {
        tundra_raft::Error::NotLeader { leader, .. } => Refusal::NotLeader { leader },
        tundra_raft::Error::Invalid(why) => Refusal::Invalid(why),
        other => Refusal::Unavailable(other.to_string()),
    }
}

impl ClusterNode {
    /// Purges this node's redo groups' logs now and then, behind what every voter holds
    /// (tundra-raft's `redo_machine`: a redo group's log would otherwise grow with every batch).
    pub(crate) fn start_redo_upkeep(self: &Arc<ClusterNode>) {
        let weak = Arc::downgrade(self);
        self.spawn(async move {
            loop {
                tokio::time::sleep(PURGE_EVERY).await;
                let Some(node) = weak.upgrade() else { return };
                node.host.purge_redo_logs(tundra_raft::redo_machine::KEEP_BEHIND).await;
            }
        });
    }

    /// Starts this node's replica of volume `def`'s redo group. The volume's first replica also
    /// makes the replicas the group's first membership if its log of the group is empty (a
    /// volume created before volumes had redo groups; for a new volume, the creation's
    /// `Initialize` finds it done and leaves it).
    pub(crate) async fn open_redo_group(&self, def: &crate::messages::VolumeDef) -> Result<(), String> {
        let group = redo_group(def.id);
        // A replica moved away (migrate.rs) stays stopped: its old log must not campaign.
        if !def.runs_redo(self.me) && self.host.has_log_of(group) {
            return Ok(());
        }
        let applier = Arc::new(NodeApplier { node: self.node.clone(), volume: def.id });
        let marks = Arc::new(crate::manager::FileSnapshots { path: mark_file(self.node.data_dir(), def.id) });
        self.host.add_redo_group(group, applier, marks, LOGS_PER_MARK).await?;
        let empty = self.host.raft(group).map_err(|e| e.to_string())?.metrics().borrow().last_log_index.is_none();
        if empty && def.redo_replicas().first() == Some(&self.me) && def.redo_move.is_none() {
            let voters = def.redo_replicas().iter().copied().collect();
            // Refused when the group has a log after all: then it has its membership.
            let _ = self.host.initialize(group, voters).await;
        }
        Ok(())
    }

    /// A redo call on a replicated volume, from any node: sent to the redo group's leader
    /// (asked again through failovers for up to [`crate::io::STALL_LIMIT`]).
    pub fn redo_request(&self, volume: u32, call: RedoCall) -> Result<RedoReply, ServiceError> {
        let forward = Forward::Redo { volume, call };
        match self.block_on(self.to_leader(redo_group(volume), forward)) {
            Ok(Answer::Redo(reply)) => reply.into_result(),
            Ok(_) => Err(ServiceError::internal("the redo leader answered another kind")),
            Err(Refusal::Invalid(why)) => Err(ServiceError::invalid(why)),
            Err(Refusal::NotLeader { .. }) => Err(ServiceError::io("the redo stream's leader moved")),
            Err(Refusal::Unavailable(why)) => Err(ServiceError::io(why)),
        }
    }

    /// The leader's side of a redo call.
    pub(crate) async fn lead_redo(&self, volume: u32, call: RedoCall) -> Result<Answer, Refusal> {
        if !self.is_replicated(volume) {
            return Err(Refusal::Invalid(format!("volume id {volume} is not replicated on node {}", self.me)));
        }
        self.refuse_deleting(volume)?;
        self.check_redo_range(volume, &call)?;
        let group = redo_group(volume);
        let local = NodeService(self.node.clone());
        let reply = match call {
            RedoCall::Append(entry) => {
                if entry.volume != volume {
                    return Err(Refusal::Invalid("a batch of another volume".into()));
                }
                let turn = self.redo_turns.of(volume);
                let _turn = turn.lock().await;
                let t0 = std::time::Instant::now();
                self.host.settle(group, SETTLE_LIMIT).await.map_err(refusal)?;
                tundra_raft::lat::note("redo.settle", t0);
                let t0 = std::time::Instant::now();
                // The epoch and durable LSN only: the full status queries the device.
                let position = tokio::task::block_in_place(|| local.redo_position(volume));
                tundra_raft::lat::note("redo.status_check", t0);
                match position {
                    Err(error) => RedoReply::refused(error),
                    Ok((writer_epoch, _)) if entry.epoch < writer_epoch => {
                        RedoReply::Appended { code: 2, value: writer_epoch }
                    }
                    Ok((_, durable_lsn)) if entry.prev_lsn != durable_lsn => {
                        RedoReply::Appended { code: 1, value: durable_lsn }
                    }
                    Ok(_) => {
                        let end_lsn = entry.end_lsn;
                        let t0 = std::time::Instant::now();
                        let held = self.host.redo_held_by_all(group);
                        self.host.propose_bytes(group, entry.encode(held)).await.map_err(refusal)?;
                        tundra_raft::lat::note("redo.propose(client_write->applied)", t0);
                        RedoReply::Appended { code: 0, value: end_lsn }
                    }
                }
            }
            call => {
                self.host.linearize(group).await.map_err(refusal)?;
                tokio::task::block_in_place(|| serve_locally(&local, volume, call))
            }
        };
        Ok(Answer::Redo(reply))
    }
}

impl ClusterNode {
    /// Redo's range checks against the size this node serves (resize.rs): no batch is taken
    /// while a resize is between its phases (a stream started then would take records past the
    /// served size, which the store's check allows), and no page past the served size is read.
    fn check_redo_range(&self, volume: u32, call: &RedoCall) -> Result<(), Refusal> {
        let Some(served) = self.served_bytes(volume) else { return Ok(()) };
        let store = self.node.volume(VolumeId(volume)).map_err(|e| Refusal::Invalid(e.to_string()))?;
        match call {
            RedoCall::Append(_) if store.volume.size_bytes != served => {
                Err(self.past_served(volume, "a redo batch".to_string(), served))
            }
            RedoCall::Read { pages, .. } => {
                let served_pages = served / store.page_size() as u64;
                match pages.iter().find(|&&page| page >= served_pages) {
                    Some(page) => Err(self.past_served(volume, format!("a redo read of page {page}"), served)),
                    None => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }
}

/// A call other than an append, answered from this node's stream.
fn serve_locally(local: &NodeService, volume: u32, call: RedoCall) -> RedoReply {
    let result = match call {
        RedoCall::Append(_) => unreachable!("appends go through the group"),
        RedoCall::Status => local.redo_status(volume).map(|s| RedoReply::Status {
            writer_epoch: s.writer_epoch,
            durable_lsn: s.durable_lsn,
            complete_lsn: s.complete_lsn,
            lsn_min: s.lsn_min,
        }),
        RedoCall::Read { pages, request_lsn, not_modified_since, lease } => {
            let mut data = Vec::new();
            let at = ReadAt { request_lsn, not_modified_since, lease };
            local.get_pages_at_lsn(volume, &pages, at, &mut data).map(|lsns| RedoReply::Pages {
                served_lsn: lsns.served_lsn,
                page_lsns: lsns.page_lsns,
                data,
            })
        }
        RedoCall::Register { reader, start_lsn } => local.register_reader(volume, reader, start_lsn).map(|l| {
            RedoReply::Lease { lease_id: l.lease_id, granted_lsn: l.granted_lsn, valid_for_ms: l.valid_for_ms }
        }),
        RedoCall::Renew { lease, apply_lsn } => local
            .renew_reader(volume, lease, apply_lsn)
            .map(|r| RedoReply::Renewed { valid_for_ms: r.valid_for_ms, lsn_min: r.lsn_min }),
        RedoCall::Release { lease } => local.release_reader(volume, lease).map(|()| RedoReply::Released),
    };
    result.unwrap_or_else(RedoReply::refused)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_round_trips_and_bad_bytes_are_refused() {
        let entry =
            RedoEntry { volume: 7, epoch: 2, prev_lsn: 10, end_lsn: 20, record_count: 1, records: vec![1, 2, 3] };
        let bytes = entry.encode(41);
        assert_eq!(RedoEntry::decode(&bytes), Ok((entry.clone(), 41)));
        let applier_reads = NodeApplier::held_by_all_of(&bytes);
        assert_eq!(applier_reads, 41);
        // Version 1, as logged before: the batch alone, held by all at 0.
        let mut first = vec![ENTRY_VERSION_1];
        first.extend(postcard::to_allocvec(&entry).unwrap());
        assert_eq!(RedoEntry::decode(&first), Ok((entry, 0)));
        assert_eq!(NodeApplier::held_by_all_of(&first), 0);
        assert!(RedoEntry::decode(&[]).is_err());
        assert!(RedoEntry::decode(&[9, 0]).unwrap_err().contains("version 9"));
        for cut in 1..bytes.len() {
            assert!(RedoEntry::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(RedoEntry::decode(&longer).unwrap_err().contains("stray"));
    }
}
