//! Growing a replicated volume: `tundra volume resize NAME --size S` through any node.
//!
//! Every node holds the volume in its store and serves its I/O, and each chunk's replicas
//! apply its writes to their own stores: a replica whose store has not grown refuses a write
//! past its old end (the store's range check) while the others take it, and the replicas
//! would then differ. So no node accepts I/O in the new range before every store grew, and the
//! range every node accepts is the catalog's *served* size ([`VolumeDef::served_size`]), never
//! the store's alone. The coordinator (the node asked) takes the claim on moves (no move
//! changes a replica set meanwhile, as a delete does) and goes in two phases:
//!
//! 1. **Grow.** Every node must answer first, or nothing changes. The manager counts the old
//!    last chunk at its new span (`GrowChunk`) and places each new chunk (seed 000 §4.2.1, as
//!    at a creation). Then on every node: the store's volume grows; the catalog takes the new
//!    size and the new chunks' replica sets durably, keeping the old size as `served_bytes`;
//!    the new chunks' groups start where the node is a replica. The new groups' first leaders
//!    initialize them and each elects a leader. No node serves the new range yet.
//! 2. **Serve.** Every node's catalog serves the whole new size.
//!
//! The store grows before the catalog names the new size: a store larger than its catalog's
//! size serves nothing past the catalog's (every range check and every group started stops
//! there), so a node that crashed in between comes up as it was, and a store that cannot grow
//! (no space) leaves its node unchanged; every node is asked whether its store can grow before
//! any does. A node whose catalog names a size its store lacks (a catalog restored from
//! another node's) grows its store at its start (`ClusterNode::open_replica`). A coordinator
//! that stops between the phases, or a node that does not answer, leaves stores grown and the
//! served size as it was on the nodes not yet at phase 2: the same command again finishes it (each step is
//! idempotent). Meanwhile a client sees the old size on those nodes: a read or write past it
//! is refused with a message that names the resize under way, and a node already at phase 2
//! whose chunk's leader is not refuses it the same way (the leader checks its own served
//! size). A smaller size than a resize already entered on some node is refused, naming it.
//!
//! A volume that takes redo grows the same way: its redo group's replicas hold its stream,
//! whose page versions take the new pages once the store grew (tundra-node's `Stream::fit_to`),
//! and the redo group's leader refuses batches while its node's store is larger than its served
//! size, so no batch names a new page before every replica's store can hold it. A volume
//! marked deleting is not resized.

use serde::{Deserialize, Serialize};
use tundra_cluster::{Command, MoveOwner};
use tundra_store::ids::{ChunkId, VolumeId};

use crate::cluster::{ClusterNode, chunk_spans, first_leaders};
use crate::manager::{ManagerCall, ManagerReply};
use crate::messages::{Answer, Forward, MembershipChange, Refusal, VolumeDef};

/// How long the coordinator waits for each new chunk's first leader.
const FIRST_LEADER_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// One node's part of a resize, asked by the coordinator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResizeStep {
    /// Answer the volume's sizes here, and whether its store can grow to `size_bytes`.
    Query { size_bytes: u64 },
    /// Phase 1 here: the store grows, the catalog takes `size_bytes` and the replica sets of
    /// chunks `first_new..` (`sets`, in order; those this node entered before are skipped),
    /// and the new chunks' groups this node runs start.
    Grow { size_bytes: u64, first_new: u32, sets: Vec<Vec<u64>> },
    /// The groups of chunks `first_new..` whose first leader is this node are initialized.
    Initialize { first_new: u32 },
    /// Phase 2 here: the catalog serves the whole `size_bytes`.
    Serve { size_bytes: u64 },
}

/// A replicated volume's sizes on one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeSizes {
    /// The catalog's size (the new one once phase 1 reached the node).
    pub size_bytes: u64,
    /// The size the node serves.
    pub served_bytes: u64,
    /// The store's volume size.
    pub store_bytes: u64,
    /// The node holds a redo stream of the volume.
    pub takes_redo: bool,
    pub deleting: bool,
}

/// A node's answer to [`ResizeStep::Query`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResizeCheck {
    pub sizes: VolumeSizes,
    /// Why the node's store cannot grow to the size asked (no space), if it cannot.
    pub refusal: Option<String>,
}

/// A test-only hook: `TUNDRA_TEST_RESIZE_STOP_AFTER_GROW` makes the coordinator stop after
/// phase 1, as if it died there: `all` (or any value not a number) after every node grew and
/// the new groups elected leaders, a number `n` after the first `n` nodes grew (nothing
/// initialized; the coordinator grows first). Unset in production.
fn test_stop_after_grow() -> Option<usize> {
    let value = std::env::var("TUNDRA_TEST_RESIZE_STOP_AFTER_GROW").ok()?;
    Some(value.parse().unwrap_or(usize::MAX))
}

/// A test-only hook: `TUNDRA_TEST_RESIZE_RANGE_FROM_STORE=1` makes this node's range checks
/// use its store's size instead of the catalog's served size: the bug the served size guards
/// against, for the twin of the resize tests. Unset in production.
fn test_range_from_store() -> bool {
    std::env::var_os("TUNDRA_TEST_RESIZE_RANGE_FROM_STORE").is_some()
}

impl ClusterNode {
    /// The bytes of replicated volume `volume` this node serves (None: not replicated here).
    pub(crate) fn served_bytes(&self, volume: u32) -> Option<u64> {
        let served = self.catalog.lock().get(volume).map(VolumeDef::served_size)?;
        if test_range_from_store() {
            return self.node.volume(VolumeId(volume)).ok().map(|v| v.volume.size_bytes);
        }
        Some(served)
    }

    /// Why bytes past `served` of volume `name` are refused, naming a resize under way.
    pub(crate) fn past_served(&self, volume: u32, what: String, served: u64) -> Refusal {
        let grown = self.catalog.lock().get(volume).filter(|def| def.size_bytes > served).map(|def| def.size_bytes);
        match grown {
            Some(size) => Refusal::Invalid(format!(
                "{what}: the volume serves {served} bytes on node {} while its resize to {size} bytes is under way; \
                 run `tundra volume resize` again to finish it",
                self.me
            )),
            None => Refusal::Invalid(format!("{what}: the volume is {served} bytes")),
        }
    }

    /// Grows replicated volume `volume` to `size_bytes` on every node (module doc). An error
    /// says how far it got; the same command again goes on.
    pub fn resize_replicated(&self, volume: u32, size_bytes: u64) -> Result<(), Refusal> {
        let def = self.def_here(volume)?;
        if def.deleting {
            return Err(Refusal::Invalid(format!("volume {:?} is being deleted", def.name)));
        }
        let page = u64::from(def.page_size);
        if size_bytes == 0 || !size_bytes.is_multiple_of(page) {
            return Err(Refusal::Invalid(format!(
                "volume size {size_bytes} is not a non-zero multiple of the page size {page}"
            )));
        }
        if size_bytes < def.served_size() {
            return Err(Refusal::Invalid(format!(
                "volume {:?} is {} bytes; shrinking it to {size_bytes} would drop data and is not supported",
                def.name,
                def.served_size()
            )));
        }
        self.block_on(async {
            let owner = MoveOwner::Move { node: self.me };
            self.claim_moves(owner).await?;
            let done = self.resize_claimed(volume, size_bytes).await;
            self.release_moves(owner).await;
            done
        })
    }

    /// Both phases, the claim on moves held.
    async fn resize_claimed(&self, volume: u32, size_bytes: u64) -> Result<(), Refusal> {
        let mut def = self.def_here(volume)?;
        if !def.moves.is_empty() || def.redo_move.is_some() {
            // A move whose coordinator died: finished or rolled back from its group's voters.
            self.settle_all().await;
            def = self.def_here(volume)?;
            if !def.moves.is_empty() || def.redo_move.is_some() {
                return Err(Refusal::Unavailable(format!(
                    "a move of volume {:?} is under way; nothing was resized, try again once it ended",
                    def.name
                )));
            }
        }
        let sizes = self.sizes_everywhere(&def, size_bytes).await?;
        let smallest = sizes.iter().map(|s| s.size_bytes).min().unwrap_or(def.size_bytes);
        let largest = sizes.iter().map(|s| s.size_bytes).max().unwrap_or(def.size_bytes);
        if size_bytes < largest {
            return Err(Refusal::Invalid(format!(
                "a resize of volume {:?} to {largest} bytes is under way (its first phase reached some nodes); \
                 nothing was changed: run it again with that size to finish it",
                def.name
            )));
        }
        if sizes.iter().all(|s| s.served_bytes == size_bytes && s.size_bytes == size_bytes) {
            return Ok(());
        }
        let first_new = chunk_spans(smallest).len() as u32;
        // Chunks past those some node's catalog names already (a run that grew some nodes
        // placed them, and this run must keep their replicas) are placed by this run: a
        // refusal before the first `Grow` gives them back (abandoned.rs).
        let named = crate::cluster::chunk_count(largest) as u32;
        let placing = named..crate::cluster::chunk_count(size_bytes) as u32;
        let placed_at = std::time::Instant::now();
        let sets = match self.place_grown(&def, size_bytes, first_new).await {
            Ok(sets) => sets,
            Err(why) => {
                self.forget_placed(volume, placing).await;
                return Err(why);
            }
        };
        let what = format!("the resize of volume {:?}", def.name);
        if let Some(refusal) = crate::abandoned::too_slow(placed_at.elapsed(), &what) {
            self.forget_placed(volume, placing).await;
            return Err(refusal);
        }
        // The coordinator first (a test hook that stops after one node grew stops there).
        let mut nodes = self.membership.ids();
        nodes.sort_by_key(|&node| node != self.me);
        let stop = test_stop_after_grow();
        let mut grown = Vec::new();
        for &node in &nodes {
            if stop.is_some_and(|n| grown.len() >= n) {
                return Err(Refusal::Unavailable(format!(
                    "volume {:?} grown on node(s) {grown:?}; the coordinator stops here (test hook)",
                    def.name
                )));
            }
            let step = crate::resize::ResizeStep::Grow { size_bytes, first_new, sets: sets.clone() };
            if let Err(why) = self.ask_patiently(node, Forward::Resize { volume, step }).await {
                return Err(Refusal::Unavailable(format!(
                    "volume {:?} is grown on node(s) {grown:?} (they still serve the old size), but node {node} did \
                     not answer ({why}): run the resize again to finish it",
                    def.name
                )));
            }
            grown.push(node);
        }
        self.first_leaders_of_new(volume, first_new).await?;
        if stop.is_some() {
            return Err(Refusal::Unavailable(format!(
                "volume {:?} grown on every node, none serves the new size; the coordinator stops here (test hook)",
                def.name
            )));
        }
        let mut served = Vec::new();
        for &node in &nodes {
            let step = crate::resize::ResizeStep::Serve { size_bytes };
            if let Err(why) = self.ask_patiently(node, Forward::Resize { volume, step }).await {
                return Err(Refusal::Unavailable(format!(
                    "volume {:?} serves {size_bytes} bytes on node(s) {served:?}, but node {node} did not answer \
                     ({why}): run the resize again to finish it",
                    def.name
                )));
            }
            served.push(node);
        }
        eprintln!("tundra: node {}: replicated volume {:?} resized to {size_bytes} bytes", self.me, def.name);
        Ok(())
    }

    /// Every node's sizes of the volume: all must answer, none may have it marked deleting,
    /// and every store must be able to grow to `size_bytes`.
    async fn sizes_everywhere(&self, def: &VolumeDef, size_bytes: u64) -> Result<Vec<VolumeSizes>, Refusal> {
        let mut sizes = Vec::new();
        for node in self.membership.ids() {
            let step = ResizeStep::Query { size_bytes };
            match self.ask_patiently(node, Forward::Resize { volume: def.id, step }).await {
                Ok(Answer::Resize(check)) if check.sizes.deleting => {
                    return Err(Refusal::Invalid(format!("volume {:?} is being deleted", def.name)));
                }
                Ok(Answer::Resize(ResizeCheck { refusal: Some(why), .. })) => {
                    return Err(Refusal::Invalid(format!(
                        "node {node} cannot grow volume {:?} to {size_bytes} bytes ({why}); nothing was changed",
                        def.name
                    )));
                }
                Ok(Answer::Resize(check)) => sizes.push(check.sizes),
                Ok(other) => return Err(Refusal::Unavailable(format!("node {node} answered {other:?}"))),
                Err(why) => {
                    return Err(Refusal::Unavailable(format!(
                        "node {node} does not answer ({why}): a replicated volume is resized on every node at once; \
                         nothing was changed, try again once it is up"
                    )));
                }
            }
        }
        Ok(sizes)
    }

    /// The manager places chunks `first_new..` (a chunk placed before, by a resize that
    /// stopped, keeps its replicas), then counts the old last chunk at its new span: the new
    /// chunks' replica sets, in order.
    async fn place_grown(&self, def: &VolumeDef, size_bytes: u64, first_new: u32) -> Result<Vec<Vec<u64>>, Refusal> {
        let spans = chunk_spans(size_bytes);
        // As at a creation: every node just answered, and placement waits for their fresh reports.
        let (state, now_unix_ms) = self.manager_state_reported_by(&self.membership.ids()).await?;
        let replicas = state.config().replicas;
        let usage = crate::placement::reported_usage(&state, now_unix_ms);
        let added: Vec<u64> = spans[first_new.saturating_sub(1) as usize..].to_vec();
        let share = crate::placement::overcommitted_share(&usage, &added, replicas);
        let expected: Vec<u64> = spans.iter().map(|&bytes| ((bytes as f64 * share) as u64).max(1)).collect();
        let mut sets = Vec::new();
        for index in first_new..spans.len() as u32 {
            let chunk = ChunkId::new(VolumeId(def.id), index);
            let expected_logical_bytes = expected[index as usize];
            let call = ManagerCall::Place { chunk: chunk.0, expected_logical_bytes, replicas };
            match self.to_manager(call).await {
                Ok(ManagerReply::Replicas(mut set)) => {
                    set.sort_unstable();
                    sets.push(set);
                }
                Ok(other) => return Err(Refusal::Unavailable(format!("a placement answered {other:?}"))),
                Err(Refusal::Invalid(why)) => {
                    return Err(Refusal::Invalid(format!("the cluster cannot hold volume {:?}: {why}", def.name)));
                }
                Err(other) => return Err(other),
            }
            // A chunk placed by a resize that stopped, to a smaller size, counts at its new span.
            self.manager_command(&Command::GrowChunk { chunk, expected_logical_bytes }).await?;
        }
        // Once every new chunk is placed, so that a resize the cluster cannot hold leaves the
        // old last chunk counted as it was (its new chunks are given back, abandoned.rs).
        if let Some(last) = first_new.checked_sub(1) {
            let chunk = ChunkId::new(VolumeId(def.id), last);
            let grow = Command::GrowChunk { chunk, expected_logical_bytes: expected[last as usize] };
            self.manager_command(&grow).await?;
        }
        Ok(sets)
    }

    /// The new chunks' groups initialized by their first leaders (as at a creation), then a
    /// leader elected in each.
    async fn first_leaders_of_new(&self, volume: u32, first_new: u32) -> Result<(), Refusal> {
        let def = self.def_here(volume)?;
        let count = chunk_spans(def.size_bytes).len() as u32;
        let sets: Vec<Vec<u64>> = (0..count).map(|index| def.replicas_of(index).to_vec()).collect();
        let mut firsts: Vec<u64> = first_leaders(&sets).into_iter().skip(first_new as usize).flatten().collect();
        firsts.sort_unstable();
        firsts.dedup();
        for node in firsts {
            let step = ResizeStep::Initialize { first_new };
            self.ask_patiently(node, Forward::Resize { volume, step }).await?;
        }
        for index in first_new..count {
            let chunk = ChunkId::new(VolumeId(volume), index);
            let query = Forward::Membership { volume, chunk: index, change: MembershipChange::Query };
            tokio::time::timeout(FIRST_LEADER_WAIT, self.to_leader(chunk, query)).await.map_err(|_| {
                Refusal::Unavailable(format!(
                    "chunk {index} of {:?} elected no leader; run the resize again to finish it",
                    def.name
                ))
            })??;
        }
        Ok(())
    }

    /// This node's part of a resize.
    pub(crate) async fn resize_step(&self, volume: u32, step: ResizeStep) -> Result<Answer, Refusal> {
        match step {
            ResizeStep::Query { size_bytes } => {
                let def = self.def_here(volume)?;
                let store = self.node.volume(VolumeId(volume)).map_err(|e| Refusal::Invalid(e.to_string()))?;
                let refusal = tokio::task::block_in_place(|| self.node.volume_resize_check(&def.name, size_bytes))
                    .err()
                    .map(|e| e.to_string());
                let sizes = VolumeSizes {
                    size_bytes: def.size_bytes,
                    served_bytes: def.served_size(),
                    store_bytes: store.volume.size_bytes,
                    takes_redo: self.node.takes_redo(&store),
                    deleting: def.deleting,
                };
                Ok(Answer::Resize(ResizeCheck { sizes, refusal }))
            }
            ResizeStep::Grow { size_bytes, first_new, sets } => {
                self.grow_here(volume, size_bytes, first_new, &sets).await.map(|()| Answer::Done)
            }
            ResizeStep::Initialize { first_new } => {
                self.initialize_from(volume, first_new).await.map(|()| Answer::Done)
            }
            ResizeStep::Serve { size_bytes } => {
                let _one = self.deletes.lock().await;
                tokio::task::block_in_place(|| self.catalog.lock().serve_all(volume, size_bytes))
                    .map_err(Refusal::Invalid)?;
                Ok(Answer::Done)
            }
        }
    }

    /// Phase 1 here: the store first, then the catalog (durably), then the new groups. A store
    /// grown past its catalog's size (a crash in between, or a catalog write that failed)
    /// changes nothing: every range check and every group started stops at the catalog's
    /// size, and the resize run again enters it.
    async fn grow_here(&self, volume: u32, size_bytes: u64, first_new: u32, sets: &[Vec<u64>]) -> Result<(), Refusal> {
        // One change of a volume's definition at a time here (a delete's steps too).
        let _one = self.deletes.lock().await;
        let def = self.def_here(volume)?;
        if def.deleting {
            return Err(Refusal::Invalid(format!("volume {:?} is being deleted", def.name)));
        }
        if def.size_bytes > size_bytes {
            return Err(Refusal::Invalid(format!(
                "volume {:?} is {} bytes on node {}: a resize to more is under way",
                def.name, def.size_bytes, self.me
            )));
        }
        if def.size_bytes < size_bytes {
            let before = chunk_spans(def.size_bytes).len() as u32;
            let skip = before.checked_sub(first_new).ok_or_else(|| {
                Refusal::Invalid(format!(
                    "volume {:?} has {before} chunks on node {}, fewer than the resize's first new chunk {first_new}",
                    def.name, self.me
                ))
            })?;
            let added = sets.get(skip as usize..).unwrap_or(&[]);
            tokio::task::block_in_place(|| -> Result<(), String> {
                let store = self.node.volume(VolumeId(volume)).map_err(|e| e.to_string())?;
                if store.volume.size_bytes < size_bytes {
                    self.node
                        .volume_resize(&def.name, size_bytes)
                        .map_err(|e| format!("growing replicated volume {:?} here: {e}", def.name))?;
                }
                self.catalog.lock().grow(volume, size_bytes, added)
            })
            .map_err(Refusal::Invalid)?;
        }
        let def = self.def_here(volume)?;
        // Invalid, not Unavailable: a store that cannot grow (no space) will not by asking again.
        self.grow_replica(&def).await.map_err(Refusal::Invalid)?;
        eprintln!(
            "tundra: node {}: replicated volume {:?} grown to {size_bytes} bytes (serving {})",
            self.me,
            def.name,
            def.served_size()
        );
        Ok(())
    }

    /// The store's volume grown to the catalog's size if it is smaller (a resize's phase 1, or
    /// a node that crashed between its catalog and its store), and the groups of the chunks
    /// this node runs started where they are not yet.
    pub(crate) async fn grow_replica(&self, def: &VolumeDef) -> Result<(), String> {
        let mut volume = self.node.volume(VolumeId(def.id)).map_err(|e| e.to_string())?;
        if volume.volume.size_bytes < def.size_bytes {
            volume = tokio::task::block_in_place(|| self.node.volume_resize(&def.name, def.size_bytes))
                .map_err(|e| format!("growing replicated volume {:?} here: {e}", def.name))?;
        }
        // Only the catalog's chunks: a store grown past the catalog (module doc) starts no group
        // for a chunk the catalog does not place.
        let count = chunk_spans(def.size_bytes).len() as u32;
        let groups: Vec<ChunkId> = crate::cluster::chunks(&volume.volume)
            .filter(|chunk| chunk.index() < count)
            .filter(|chunk| def.runs(self.me, chunk.index()) && self.host.raft(*chunk).is_err())
            .collect();
        if groups.is_empty() {
            return Ok(());
        }
        self.host.add_groups_on(&groups, volume.pages().clone()).await
    }
}
