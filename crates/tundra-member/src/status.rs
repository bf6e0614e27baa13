//! `tundra cluster status`: every node's view of its groups, merged into one report of the
//! nodes (`nodes[]`: `id`, `addr`, `up`, the drive's logical and physical usage and capacity,
//! the compression ratio, the chunks whose replicas it runs) and the chunks (`chunks[]`: `volume`, `chunk`,
//! `replicas`, `leader`, `term`, `commit_index`, `applied_index`, `lag`, and each replica's
//! applied index, and `moving`, the move of a replica the answering node's catalog lists as
//! under way), and the same of each volume's redo group (`redo[]`). A chunk's figures are its leader's; `lag` is how many committed entries the
//! replica furthest behind has not applied (null while a replica does not answer). `traffic`
//! counts the bytes the answering node sent its peers: Raft messages and everything else;
//! `repair` what repair of bad pages and the scrub did there; `manager` the cluster manager's
//! group (`members`, `leader`, `term`, `applied_index`) and its state's summary (`nodes` with
//! each one's `status` and `chunks`, `chunks`, `moves_in_flight`, `chunks_sized`, and the
//! leader's `background_rebalance` record), or `error` when it has no leader; `refused_volumes` the
//! replicated volumes the answering node refused to adopt (adopt.rs). Each chunk (and each node's `chunks[]` entry) carries its `logical_bytes` and
//! `physical_bytes`, counted as the node's usage is.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::cluster::ClusterNode;
use crate::messages::{Answer, ChunkSize, Forward, GroupView, LocalStatus, NodeUsage, PeerRequest, PeerResponse};

/// How long a status waits for each peer.
const STATUS_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Clone, Debug, Serialize)]
pub struct NodeStatus {
    pub id: u64,
    pub addr: String,
    pub up: bool,
    /// For a peer of the answering node: whether its link is in reach (connected, and heard
    /// from within the transport's `SILENCE`), which decides whether a leader here captures a
    /// chunk to send it; null for the answering node itself.
    pub linked: Option<bool>,
    /// The node's drive space (null while the node does not answer).
    pub usage: Option<NodeUsage>,
    /// Logical over physical bytes used (null when nothing is stored or the node is down).
    pub ratio: Option<f64>,
    /// The chunks whose replicas the node runs.
    pub chunks: Vec<HeldChunk>,
}

/// A chunk replica a node runs, with its space there (null while the node does not say).
#[derive(Clone, Debug, Serialize)]
pub struct HeldChunk {
    pub volume_id: u32,
    pub chunk: u32,
    pub logical_bytes: Option<u64>,
    pub physical_bytes: Option<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChunkStatus {
    pub volume: String,
    pub volume_id: u32,
    pub chunk: u32,
    pub replicas: Vec<u64>,
    pub leader: Option<u64>,
    pub term: u64,
    pub commit_index: Option<u64>,
    pub applied_index: Option<u64>,
    pub lag: Option<u64>,
    /// Each replica's applied index, by node id (null for a node that did not answer).
    pub replica_applied: BTreeMap<u64, Option<u64>>,
    /// The chunk's logical and physical bytes as its leader's replica holds them (another
    /// replica's when the leader does not answer; null when none does): what the scheduler
    /// counts (seed 000 §4.2.2).
    pub logical_bytes: Option<u64>,
    pub physical_bytes: Option<u64>,
    /// Each replica's last purged log index, by node id (null for a node that did not answer
    /// or has purged nothing): how far the group's log has been compacted.
    pub replica_purged: BTreeMap<u64, Option<u64>>,
    /// The move of one of the group's replicas that the answering node's catalog lists as
    /// under way (null when none): `from` and `to`.
    pub moving: Option<crate::messages::RedoMove>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ClusterStatus {
    /// The node that answered.
    pub node: u64,
    pub nodes: Vec<NodeStatus>,
    pub chunks: Vec<ChunkStatus>,
    /// Each replicated volume's redo group, in the figures of a chunk (`chunk` is 0).
    pub redo: Vec<ChunkStatus>,
    /// What the answering node sent to its peers since it started (message bodies).
    pub traffic: crate::transport::TrafficStats,
    /// What repair of bad pages and the background scrub did on the answering node since it
    /// started.
    pub repair: tundra_raft::RepairStats,
    /// The cluster manager's group and the summary of its state, as its leader has them.
    pub manager: crate::manager::ManagerStatus,
    /// The replicated volumes the answering node refused to adopt from its peers' catalogs,
    /// each with why (one of its own volumes has the id or the name; adopt.rs).
    pub refused_volumes: Vec<String>,
}

impl ClusterNode {
    /// This node's groups as it sees them.
    pub(crate) fn local_status(&self) -> LocalStatus {
        let groups = self
            .host
            .groups()
            .into_iter()
            .filter_map(|chunk| {
                let raft = self.host.raft(chunk).ok()?;
                let metrics = raft.metrics().borrow().clone();
                Some(GroupView {
                    volume: chunk.volume().0,
                    chunk: chunk.0,
                    leader: metrics.current_leader,
                    term: metrics.current_term,
                    last_log_index: metrics.last_log_index,
                    commit_index: self.host.committed(chunk),
                    applied_index: metrics.last_applied.map(|id| id.index),
                    voters: metrics.membership_config.membership().voter_ids().collect(),
                    purged_index: metrics.purged.map(|id| id.index),
                })
            })
            .collect();
        LocalStatus { node: self.me, groups, usage: self.usage() }
    }

    /// Every answering node's chunk sizes (crate::messages::ChunkSize), by node id.
    pub(crate) fn all_chunk_sizes(&self) -> BTreeMap<u64, Vec<ChunkSize>> {
        self.block_on(async {
            let mut sizes = BTreeMap::new();
            for id in self.membership.ids() {
                let answer = if id == self.me {
                    Ok(Answer::ChunkSizes(self.chunk_sizes()))
                } else {
                    match self.transport.call(id, &PeerRequest::Forward(Forward::ChunkSizes), STATUS_TIMEOUT).await {
                        Ok(PeerResponse::Forward(answer)) => answer,
                        _ => Err(crate::messages::Refusal::Unavailable(format!("node {id} did not answer"))),
                    }
                };
                if let Ok(Answer::ChunkSizes(list)) = answer {
                    sizes.insert(id, list);
                }
            }
            sizes
        })
    }

    /// Every node's view, merged.
    pub fn status(&self) -> ClusterStatus {
        let views: BTreeMap<u64, Option<LocalStatus>> = self.block_on(async {
            let mut views = BTreeMap::new();
            for id in self.membership.ids() {
                let view = if id == self.me {
                    Some(self.local_status())
                } else {
                    match self.transport.call(id, &PeerRequest::Forward(Forward::LocalStatus), STATUS_TIMEOUT).await {
                        Ok(PeerResponse::Forward(Ok(Answer::Status(status)))) => Some(status),
                        _ => None,
                    }
                };
                views.insert(id, view);
            }
            views
        });
        let sizes = self.all_chunk_sizes();
        let size_of = |node: u64, volume: u32, chunk: u32| {
            sizes.get(&node).and_then(|s| s.iter().find(|c| c.volume == volume && c.chunk == chunk))
        };
        let nodes = self
            .membership
            .nodes()
            .iter()
            .map(|(id, addr)| {
                let view = views.get(id).and_then(Option::as_ref);
                let usage = view.map(|v| v.usage);
                NodeStatus {
                    id: *id,
                    addr: addr.clone(),
                    up: view.is_some(),
                    linked: (*id != self.me).then(|| self.transport.is_connected(*id)),
                    usage,
                    ratio: usage
                        .filter(|u| u.physical_used_bytes > 0)
                        .map(|u| u.logical_used_bytes as f64 / u.physical_used_bytes as f64),
                    chunks: view
                        .map(|v| {
                            v.groups
                                .iter()
                                // A volume's redo group is reported in `redo[]`, the manager's
                                // group in `manager`, not as chunks.
                                .filter(|g| {
                                    tundra_raft::manager_machine::is_chunk_group(tundra_store::ids::ChunkId(g.chunk))
                                })
                                .map(|g| {
                                    let chunk = tundra_store::ids::ChunkId(g.chunk).index();
                                    let size = size_of(*id, g.volume, chunk);
                                    HeldChunk {
                                        volume_id: g.volume,
                                        chunk,
                                        logical_bytes: size.map(|s| s.logical_bytes),
                                        physical_bytes: size.map(|s| s.physical_bytes),
                                    }
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
                }
            })
            .collect();
        let catalog = self.catalog.lock().volumes().to_vec();
        let mut chunks = Vec::new();
        let mut redo = Vec::new();
        for def in &catalog {
            let Ok(volume) = self.node.volume(tundra_store::ids::VolumeId(def.id)) else { continue };
            // The catalog's chunks: a store grown past its catalog (resize.rs) has no more.
            let count = crate::cluster::chunk_spans(def.size_bytes).len() as u32;
            for chunk in crate::cluster::chunks(&volume.volume).filter(|chunk| chunk.index() < count) {
                let mut status = group_status(def, def.replicas_of(chunk.index()), &views, chunk, chunk.index());
                status.moving =
                    def.move_of(chunk.index()).map(|m| crate::messages::RedoMove { from: m.from, to: m.to });
                let first = status.leader.into_iter().chain(status.replicas.iter().copied());
                if let Some(size) = first.filter_map(|n| size_of(n, def.id, chunk.index())).next() {
                    status.logical_bytes = Some(size.logical_bytes);
                    status.physical_bytes = Some(size.physical_bytes);
                }
                chunks.push(status);
            }
            let mut group =
                group_status(def, def.redo_replicas(), &views, tundra_raft::redo_machine::redo_group(def.id), 0);
            group.moving = def.redo_move;
            redo.push(group);
        }
        let repair = self.host.repair_stats();
        let refused_volumes = self.refused_volumes.lock().values().cloned().collect();
        let manager = self.block_on(self.manager_status());
        ClusterStatus {
            node: self.me,
            nodes,
            chunks,
            redo,
            traffic: self.transport.traffic(),
            repair,
            manager,
            refused_volumes,
        }
    }
}

/// One group of a replicated volume as the replicas' views show it: the figures of the leader
/// with the highest term.
fn group_status(
    def: &crate::messages::VolumeDef,
    replicas: &[u64],
    views: &BTreeMap<u64, Option<LocalStatus>>,
    group: tundra_store::ids::ChunkId,
    index: u32,
) -> ChunkStatus {
    let of =
        |node: u64| -> Option<&GroupView> { views.get(&node)?.as_ref()?.groups.iter().find(|g| g.chunk == group.0) };
    let leader =
        replicas.iter().filter_map(|&n| of(n)).filter_map(|g| g.leader).max_by_key(|&l| of(l).map_or(0, |g| g.term));
    let led = leader.and_then(of).filter(|g| g.leader == leader);
    let replica_applied: BTreeMap<u64, Option<u64>> =
        replicas.iter().map(|&n| (n, of(n).map(|g| g.applied_index.unwrap_or(0)))).collect();
    let commit = led.and_then(|g| g.commit_index);
    let lag = match (commit, replica_applied.values().copied().collect::<Option<Vec<u64>>>()) {
        (Some(commit), Some(applied)) => applied.iter().map(|&a| commit.saturating_sub(a)).max(),
        (None, Some(_)) => Some(0),
        _ => None,
    };
    ChunkStatus {
        volume: def.name.clone(),
        volume_id: def.id,
        chunk: index,
        replicas: replicas.to_vec(),
        leader: led.and(leader),
        term: led.map_or(0, |g| g.term),
        commit_index: commit,
        applied_index: led.and_then(|g| g.applied_index),
        lag,
        replica_applied,
        logical_bytes: None,
        physical_bytes: None,
        replica_purged: replicas.iter().map(|&n| (n, of(n).and_then(|g| g.purged_index))).collect(),
        moving: None,
    }
}
