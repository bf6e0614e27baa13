//! Deleting a replicated volume: `tundra volume delete NAME` through any node of the cluster.
//!
//! Every node holds a replicated volume (its catalog entry and its volume in the store, so
//! that any node serves its I/O), and its chunks' and redo stream's replicas live on a few of
//! them. A delete must not leave a volume half there: some replicas dropped while another node
//! still serves it, or a node that restarts and brings an empty replica back. So it goes in
//! two steps, as a volume's creation does in the other direction:
//!
//! 1. **Mark.** The coordinator (the node asked) takes the claim on moves (no chunk of the
//!    volume moves meanwhile; a move already under way is settled first), checks that every
//!    node answers, and enters `deleting` in every node's catalog, durably. From then on no
//!    node takes I/O or redo for the volume, and no node starts its groups at a restart. A
//!    node that does not answer stops the delete here, with the nodes marked so far named: the
//!    same command finishes it.
//! 2. **Finish.** The manager forgets the volume's chunks (`DeleteChunk`, seed 000 §4.2: they no
//!    longer count against their nodes), then every node stops its replicas of the volume's
//!    groups, deletes the volume from its store (its pages' blocks freed and trimmed) and last
//!    removes the catalog entry.
//!
//! Once every node is marked, nothing can undo the delete, and each node finishes it by
//! itself: a node with a marked entry asks the others every [`UPKEEP_EVERY`] and finishes
//! once each of them holds the volume marked or not at all (so every node was marked). A
//! coordinator that died between the steps, or a node that was down for the second one, is
//! thereby caught up without anyone running the command again. A node that is gone for good
//! keeps the others' marked entries waiting for it; they take no I/O and hold no group.
//!
//! The shared Raft log keeps the dropped groups' records until it compacts them, as a moved
//! replica's do; volume ids are never given out twice (the store's id floor), so no new group
//! takes them for its own.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tundra_cluster::{Command, MoveOwner};
use tundra_store::ids::{ChunkId, VolumeId};

use crate::cluster::{ClusterNode, chunk_spans};
use crate::messages::{Answer, Forward, Refusal, VolumeDef};

/// How often a node looks at the volumes its catalog marks deleting.
const UPKEEP_EVERY: Duration = Duration::from_secs(2);

/// One node's part of a delete, asked by the coordinator or a node's upkeep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeleteStep {
    /// Answer whether the catalog holds the volume, and marked or not.
    Query,
    /// Mark the volume deleting in the catalog, durably.
    Mark,
    /// Drop this node's replicas and the volume, then its catalog entry (it must be marked).
    Finish,
}

impl ClusterNode {
    /// Refuses I/O on a volume marked deleting.
    pub(crate) fn refuse_deleting(&self, volume: u32) -> Result<(), Refusal> {
        match self.catalog.lock().get(volume) {
            Some(def) if def.deleting => Err(Refusal::Invalid(format!("volume {:?} is being deleted", def.name))),
            _ => Ok(()),
        }
    }

    /// Deletes replicated volume `volume` from every node: marks it everywhere, then finishes
    /// everywhere (module doc). An error says how far it got; the same command again goes on.
    pub fn delete_replicated(&self, volume: u32) -> Result<(), Refusal> {
        let def = self.catalog.lock().get(volume).cloned();
        let def = def.ok_or_else(|| Refusal::Invalid(format!("volume id {volume} is not replicated here")))?;
        self.block_on(async {
            if !def.deleting {
                let owner = MoveOwner::Move { node: self.me };
                self.claim_moves(owner).await?;
                let marked = self.mark_everywhere(volume).await;
                self.release_moves(owner).await;
                marked?;
            }
            if std::env::var_os("TUNDRA_TEST_DELETE_STOP_AFTER_MARK").is_some() {
                return Err(Refusal::Unavailable(format!(
                    "volume {:?} is marked deleting on every node; the coordinator stops here (test hook)",
                    def.name
                )));
            }
            self.forget_chunks(&def).await?;
            let mut missing = Vec::new();
            for node in self.membership.ids() {
                if let Err(why) = self.ask(node, Forward::Delete { volume, step: DeleteStep::Finish }).await {
                    missing.push(format!("node {node} ({why})"));
                }
            }
            if missing.is_empty() {
                Ok(())
            } else {
                Err(Refusal::Unavailable(format!(
                    "volume {:?} is deleted; {} did not finish yet and will by itself once it answers",
                    def.name,
                    missing.join(", ")
                )))
            }
        })
    }

    /// Step 1: the claim on moves is held. Every node must answer before any is marked.
    async fn mark_everywhere(&self, volume: u32) -> Result<(), Refusal> {
        let mut def = self.def_here(volume)?;
        if !def.moves.is_empty() || def.redo_move.is_some() {
            // A move whose coordinator died: finished or rolled back from its group's voters.
            self.settle_all().await;
            def = self.def_here(volume)?;
            if let Some(m) = def.moves.first() {
                return Err(Refusal::Unavailable(format!(
                    "a move of chunk {} of volume {:?} from node {} to node {} is under way; nothing was deleted, try \
                     again once it ended",
                    m.chunk, def.name, m.from, m.to
                )));
            }
            if let Some(m) = def.redo_move {
                return Err(Refusal::Unavailable(format!(
                    "a move of volume {:?}'s redo replica from node {} to node {} is under way; nothing was deleted, \
                     try again once it ended",
                    def.name, m.from, m.to
                )));
            }
        }
        let nodes = self.membership.ids();
        for &node in &nodes {
            // As a creation does: a node that just started may not be connected yet.
            if let Err(why) = self.ask_patiently(node, Forward::Delete { volume, step: DeleteStep::Query }).await {
                return Err(Refusal::Unavailable(format!(
                    "node {node} does not answer ({}): a replicated volume is deleted on every node at once; nothing \
                     was deleted, try again once it is up",
                    why
                )));
            }
        }
        let mut marked = Vec::new();
        for &node in &nodes {
            if let Err(why) = self.ask_patiently(node, Forward::Delete { volume, step: DeleteStep::Mark }).await {
                return Err(Refusal::Unavailable(format!(
                    "volume {:?} is marked deleting on node(s) {marked:?} (it takes no I/O there), but node {node} did \
                     not answer ({}): run the delete again to finish it",
                    def.name, why
                )));
            }
            marked.push(node);
        }
        Ok(())
    }

    pub(crate) fn def_here(&self, volume: u32) -> Result<VolumeDef, Refusal> {
        let def = self.catalog.lock().get(volume).cloned();
        def.ok_or_else(|| Refusal::Invalid(format!("volume id {volume} is not replicated here")))
    }

    /// The manager forgets the volume's chunks; one it does not know is forgotten already.
    async fn forget_chunks(&self, def: &VolumeDef) -> Result<(), Refusal> {
        for index in 0..chunk_spans(def.size_bytes).len() as u32 {
            let chunk = ChunkId::new(VolumeId(def.id), index);
            match self.manager_command(&Command::DeleteChunk { chunk }).await {
                Ok(()) | Err(Refusal::Invalid(_)) => {}
                Err(other) => return Err(other),
            }
        }
        Ok(())
    }

    /// This node's part of a delete.
    pub(crate) async fn delete_step(&self, volume: u32, step: DeleteStep) -> Result<Answer, Refusal> {
        match step {
            DeleteStep::Query => Ok(Answer::Deleting(self.catalog.lock().get(volume).map(|def| def.deleting))),
            DeleteStep::Mark => {
                let _one = self.deletes.lock().await;
                if self.catalog.lock().get(volume).is_none() {
                    // Finished here already.
                    return Ok(Answer::Done);
                }
                tokio::task::block_in_place(|| self.catalog.lock().mark_deleting(volume)).map_err(Refusal::Invalid)?;
                Ok(Answer::Done)
            }
            DeleteStep::Finish => self.finish_here(volume).await.map(|()| Answer::Done),
        }
    }

    /// Step 2 here: the volume's groups stopped, the volume deleted from the store, then the
    /// catalog entry removed (last, so that a crash in between leaves the mark and the upkeep
    /// finishes at the next start).
    async fn finish_here(&self, volume: u32) -> Result<(), Refusal> {
        let _one = self.deletes.lock().await;
        let Some(def) = self.catalog.lock().get(volume).cloned() else { return Ok(()) };
        if !def.deleting {
            return Err(Refusal::Invalid(format!(
                "volume {:?} is not marked deleting on node {}: a delete marks every node first",
                def.name, self.me
            )));
        }
        for index in 0..chunk_spans(def.size_bytes).len() as u32 {
            let chunk = ChunkId::new(VolumeId(volume), index);
            if self.host.raft(chunk).is_ok() {
                self.host.drop_group(chunk).await.map_err(Refusal::Unavailable)?;
            }
        }
        let redo = tundra_raft::redo_machine::redo_group(volume);
        if self.host.raft(redo).is_ok() {
            self.host.drop_redo_group(redo).await.map_err(Refusal::Unavailable)?;
        }
        let node = self.node.clone();
        tokio::task::block_in_place(|| -> Result<(), String> {
            let _ = std::fs::remove_file(crate::redo::mark_file(node.data_dir(), volume));
            if node.volume(VolumeId(volume)).is_ok() {
                node.volume_delete(&def.name).map_err(|e| format!("deleting volume {:?} here: {e}", def.name))?;
            }
            self.catalog.lock().remove(volume)
        })
        .map_err(Refusal::Unavailable)?;
        eprintln!("tundra: node {}: replicated volume {:?} (id {volume}) deleted here", self.me, def.name);
        Ok(())
    }

    /// Every [`UPKEEP_EVERY`]: the volumes this node's catalog marks deleting are finished here
    /// once every other node holds them marked or not at all (module doc).
    pub(crate) fn start_delete_upkeep(self: &std::sync::Arc<ClusterNode>) {
        if std::env::var_os("TUNDRA_TEST_DELETE_NO_UPKEEP").is_some() {
            return;
        }
        let weak = std::sync::Arc::downgrade(self);
        self.spawn(async move {
            loop {
                tokio::time::sleep(UPKEEP_EVERY).await;
                let Some(node) = weak.upgrade() else { return };
                node.finish_marked().await;
            }
        });
    }

    async fn finish_marked(&self) {
        let marked: Vec<VolumeDef> = self.catalog.lock().volumes().iter().filter(|d| d.deleting).cloned().collect();
        for def in marked {
            let mut all_marked = true;
            for node in self.membership.ids().into_iter().filter(|&n| n != self.me) {
                match self.ask(node, Forward::Delete { volume: def.id, step: DeleteStep::Query }).await {
                    Ok(Answer::Deleting(None | Some(true))) => {}
                    _ => all_marked = false,
                }
            }
            if !all_marked || self.forget_chunks(&def).await.is_err() {
                continue;
            }
            if let Err(why) = self.finish_here(def.id).await {
                eprintln!("tundra: node {}: finishing the delete of volume {:?}: {}", self.me, def.name, why);
            }
        }
    }
}
