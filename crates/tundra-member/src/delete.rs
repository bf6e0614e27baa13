//! Deleting a replicated volume: `tundra volume delete NAME` through any node of the cluster.
//!
//! Every node holds a replicated volume (its catalog entry and its volume in the store, so
//! that any node serves its I/O), and its chunks' and redo stream's replicas live on a few of
//! them. A delete must not leave a volume half there: some replicas dropped while another node
//! still serves it, or a node that restarts and brings an empty replica back. So it goes in
//! two steps, as a volume's creation does in the other direction:
//!
//! 1. **Mark.** The coordinator (the node asked) takes the claim on moves (no chunk of the
//!    volume moves meanwhile; a move already under way is settled first), asks every node,
//!    and enters `deleting` in the catalog of every node that answers, durably. From then on
//!    those nodes take no I/O or redo for the volume and start none of its groups at a
//!    restart. The nodes that answer must *decide* the delete ([`decides`]): a majority of the
//!    cluster's nodes, and a majority of the replicas of each of the volume's groups (every
//!    chunk's and the redo group's). Otherwise nothing is marked and the delete is refused,
//!    with the silent nodes named.
//! 2. **Finish.** The manager forgets the volume's chunks (`DeleteChunk`, seed 000 §4.2: they no
//!    longer count against their nodes), then every marked node stops its replicas of the
//!    volume's groups, deletes the volume from its store (its pages' blocks freed and
//!    trimmed) and last removes the catalog entry, entering the volume's id among its deleted
//!    ones (catalog.rs).
//!
//! Nothing undoes a mark, so a mark anywhere ends in the volume's delete everywhere:
//! - A node with a marked entry asks the others every [`UPKEEP_EVERY`], marks those that
//!   answer unmarked, and finishes once the marked (or finished) nodes decide the delete. A
//!   coordinator that died between the steps, or in the middle of the marks, is thereby
//!   caught up without anyone running the command again.
//! - A node that was down learns the delete at its catalog catch-up (adopt.rs), a few
//!   seconds after it starts: a peer lists the volume marked or among its deleted ones, and
//!   the node marks its own entry, which its upkeep then finishes. Until then its replicas
//!   cannot serve the volume: the marked replicas, a majority of each group, stopped theirs
//!   or start none, so its groups elect no leader.
//!
//! The shared Raft log keeps the dropped groups' records until it compacts them, as a moved
//! replica's do; volume ids are never given out twice (the store's id floor), so no new group
//! takes them for its own.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tundra_cluster::{Command, MoveOwner};
use tundra_store::ids::{ChunkId, VolumeId};

use crate::cluster::{CONNECT_WAIT, ClusterNode, chunk_spans};
use crate::messages::{Answer, Forward, Refusal, VolumeDef};

/// How often a node looks at the volumes its catalog marks deleting.
const UPKEEP_EVERY: Duration = Duration::from_secs(2);
/// How long the marks' step waits for the nodes, asked once already before the claim on moves.
const RECHECK_WAIT: Duration = Duration::from_secs(1);

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

    /// Deletes replicated volume `volume` from every node: marks it on the nodes that answer,
    /// then finishes there (module doc); the others finish once they are back. An error says
    /// how far it got; the same command again goes on.
    pub fn delete_replicated(&self, volume: u32) -> Result<(), Refusal> {
        let def = self.catalog.lock().get(volume).cloned();
        let def = def.ok_or_else(|| Refusal::Invalid(format!("volume id {volume} is not replicated here")))?;
        self.block_on(async {
            let mut silent = Vec::new();
            if !def.deleting {
                // Refused before the claim on moves is asked for when too few nodes answer:
                // a claim proposed without a quorum may still commit once the nodes are back,
                // and would then hold other movers off until its lease ends.
                self.enough_answer(&def, CONNECT_WAIT).await?;
                let owner = MoveOwner::Move { node: self.me };
                self.claim_moves(owner).await?;
                let marked = self.mark_everywhere(volume).await;
                self.release_moves(owner).await;
                silent = marked?;
            }
            if std::env::var_os("TUNDRA_TEST_DELETE_STOP_AFTER_MARK").is_some() {
                return Err(Refusal::Unavailable(format!(
                    "volume {:?} is marked deleting on every node; the coordinator stops here (test hook)",
                    def.name
                )));
            }
            self.forget_chunks(&def).await?;
            let mut missing = Vec::new();
            for node in self.membership.ids().into_iter().filter(|node| !silent.contains(node)) {
                if let Err(why) = self.ask(node, Forward::Delete { volume, step: DeleteStep::Finish }).await {
                    missing.push(format!("node {node} ({why})"));
                }
            }
            if !silent.is_empty() {
                eprintln!(
                    "tundra: node {}: volume {:?} (id {volume}) deleted; node(s) {silent:?} did not answer and finish the \
                     delete when they are back",
                    self.me, def.name
                );
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

    /// Step 1: the claim on moves is held. The nodes that answer must decide the delete
    /// before any is marked; answers the nodes that did not answer.
    async fn mark_everywhere(&self, volume: u32) -> Result<Vec<u64>, Refusal> {
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
        // Asked again, briefly: the nodes were asked before the claim.
        let (answering, silent) = self.enough_answer(&def, RECHECK_WAIT).await?;
        let mut marked = Vec::new();
        for &node in &answering {
            if let Err(why) = self.ask_patiently(node, Forward::Delete { volume, step: DeleteStep::Mark }).await {
                return Err(Refusal::Unavailable(format!(
                    "volume {:?} is marked deleting on node(s) {marked:?} (it takes no I/O there), but node {node} did \
                     not answer ({}): the marked nodes finish the delete by themselves once enough nodes answer, or \
                     run the delete again",
                    def.name, why
                )));
            }
            marked.push(node);
        }
        Ok(silent)
    }

    /// The nodes that answer and those silent, when the answering ones decide the delete of
    /// `def` ([`decides`]); else the refusal.
    async fn enough_answer(&self, def: &VolumeDef, patience: Duration) -> Result<(Vec<u64>, Vec<u64>), Refusal> {
        let nodes = self.membership.ids();
        let answering = self.answering(&nodes, def.id, patience).await;
        let silent: Vec<u64> = nodes.iter().copied().filter(|node| !answering.contains(node)).collect();
        match decides(def, &nodes, &answering) {
            Ok(()) => Ok((answering, silent)),
            Err(why) => Err(Refusal::Unavailable(format!(
                "node(s) {silent:?} do not answer, and {why}: deleting a replicated volume needs a majority of the \
                 cluster's nodes and of each of its groups' replicas up; nothing was deleted, try again once more \
                 nodes are up"
            ))),
        }
    }

    /// The nodes of `nodes` that answer whether they hold volume `volume`, each asked again
    /// while unreachable for up to `patience` in all (a node that just started may not be
    /// connected yet; a node down stays silent).
    async fn answering(&self, nodes: &[u64], volume: u32, patience: Duration) -> Vec<u64> {
        let deadline = tokio::time::Instant::now() + patience;
        let mut answering = Vec::new();
        loop {
            for &node in nodes.iter().filter(|node| !answering.contains(*node)).collect::<Vec<_>>() {
                if let Ok(Answer::Deleting(_)) =
                    self.ask(node, Forward::Delete { volume, step: DeleteStep::Query }).await
                {
                    answering.push(node);
                }
            }
            if answering.len() == nodes.len() || tokio::time::Instant::now() >= deadline {
                answering.sort_unstable();
                return answering;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(crate) fn def_here(&self, volume: u32) -> Result<VolumeDef, Refusal> {
        let def = self.catalog.lock().get(volume).cloned();
        def.ok_or_else(|| Refusal::Invalid(format!("volume id {volume} is not replicated here")))
    }

    /// The manager forgets every chunk of the volume its state holds, those past the catalog's
    /// size too (a resize that placed new chunks and was never finished left them there); one
    /// forgotten meanwhile is forgotten already.
    async fn forget_chunks(&self, def: &VolumeDef) -> Result<(), Refusal> {
        let volume = VolumeId(def.id);
        let (state, _) = self.manager_state_now().await?;
        for &chunk in state.chunks().keys().filter(|chunk| chunk.volume() == volume) {
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
        let nodes = self.membership.ids();
        for def in marked {
            // A node without the entry finished the delete (a replica's node always had it:
            // the entry comes before the replica, at a creation or an adoption).
            let mut done = vec![self.me];
            for &node in nodes.iter().filter(|&&n| n != self.me) {
                let volume = def.id;
                let marked_there = match self.ask(node, Forward::Delete { volume, step: DeleteStep::Query }).await {
                    Ok(Answer::Deleting(None | Some(true))) => true,
                    Ok(Answer::Deleting(Some(false))) => {
                        self.ask(node, Forward::Delete { volume, step: DeleteStep::Mark }).await.is_ok()
                    }
                    _ => false,
                };
                if marked_there {
                    done.push(node);
                }
            }
            if decides(&def, &nodes, &done).is_err() || self.forget_chunks(&def).await.is_err() {
                continue;
            }
            if let Err(why) = self.finish_here(def.id).await {
                eprintln!("tundra: node {}: finishing the delete of volume {:?}: {}", self.me, def.name, why);
            }
        }
    }
}

/// Whether the nodes in `marked`, of the cluster's `nodes`, decide the delete of volume `def`:
/// a majority of the cluster's nodes, and a majority of the replicas of each of its groups.
/// Then a node that was not marked can neither serve the volume (its groups elect no leader
/// without the marked replicas) nor miss the delete (its catalog catch-up asks a majority of
/// the nodes). `Err` says what is lacking.
pub(crate) fn decides(def: &VolumeDef, nodes: &[u64], marked: &[u64]) -> Result<(), String> {
    let counted = |set: &[u64]| set.iter().filter(|node| marked.contains(*node)).count();
    if counted(nodes) <= nodes.len() / 2 {
        return Err(format!("nodes {marked:?} are no majority of the cluster's nodes {nodes:?}"));
    }
    for index in 0..chunk_spans(def.size_bytes).len() as u32 {
        let replicas = def.replicas_of(index);
        if counted(replicas) <= replicas.len() / 2 {
            return Err(format!("nodes {marked:?} are no majority of chunk {index}'s replicas {replicas:?}"));
        }
    }
    let redo = def.redo_replicas();
    if counted(redo) <= redo.len() / 2 {
        return Err(format!("nodes {marked:?} are no majority of the redo group's replicas {redo:?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(chunks: Vec<Vec<u64>>, redo: Option<Vec<u64>>) -> VolumeDef {
        let mut all: Vec<u64> = chunks.iter().flatten().copied().collect();
        all.sort_unstable();
        all.dedup();
        VolumeDef {
            id: 7,
            name: "v".into(),
            size_bytes: chunks.len() as u64 * tundra_store::volume::DEFAULT_CHUNK_BYTES,
            page_size: 8192,
            replicas: all,
            chunks,
            moves: Vec::new(),
            redo,
            redo_move: None,
            deleting: false,
            served_bytes: None,
        }
    }

    #[test]
    fn a_delete_is_decided_by_a_majority_of_the_nodes_and_of_every_group() {
        let nodes = [1, 2, 3, 4, 5];
        let v = def(vec![vec![1, 2, 3], vec![3, 4, 5]], None);
        assert!(decides(&v, &nodes, &[1, 2, 3, 4, 5]).is_ok());
        assert!(decides(&v, &nodes, &[1, 3, 4]).is_ok(), "two of each chunk's three, three of five nodes");
        assert!(decides(&v, &nodes, &[1, 2, 4, 5]).is_ok(), "node 3, in both chunks, down");
        assert!(decides(&v, &nodes, &[1, 2]).expect_err("two of five").contains("cluster"));
        assert!(decides(&v, &nodes, &[1, 2, 4]).expect_err("one of chunk 1's").contains("chunk 1"));
        // The redo group on other nodes than the chunks' after a move.
        let moved = def(vec![vec![1, 2, 3]], Some(vec![3, 4, 5]));
        assert!(decides(&moved, &nodes, &[1, 2, 3]).expect_err("one of the redo group's").contains("redo"));
        assert!(decides(&moved, &nodes, &[1, 3, 4]).is_ok());
        // A volume of one replica: its node must be marked.
        let single = def(vec![vec![2]], None);
        assert!(decides(&single, &nodes, &[1, 3, 4]).is_err(), "the one replica's node is down");
        assert!(decides(&single, &nodes, &[1, 2, 3]).is_ok());
    }
}
