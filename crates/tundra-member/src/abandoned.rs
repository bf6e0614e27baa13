//! Placements that no volume came to use are forgotten (issue 15). A creation or a resize
//! asks the cluster manager to place its new chunks (`PlaceChunkAt`, seed 000 §4.2.1), then
//! enters them in the nodes' catalogs. Each placed chunk counts against its nodes' logical and
//! physical space from the moment it is placed, so a placement that no catalog ever names
//! would hold space on three nodes for good: the cluster would refuse volumes it has room for,
//! and its plans would count chunks that do not exist. Two ways stop that:
//!
//! 1. **The coordinator forgets what it placed when it stops before any node heard.** A
//!    creation or resize that is refused while placing (the cluster cannot hold the last
//!    chunks, the manager lost its leader) or before it sent its catalog change deletes the
//!    chunks it placed (`DeleteChunk`), so the same command run again places afresh, and a
//!    smaller one fits. Chunks a node's catalog already names (a resize that grew some nodes
//!    earlier) are kept: the next run must finish with the same replicas.
//! 2. **The manager's leader forgets what a dead coordinator left.** A coordinator killed
//!    between the placement and its first catalog change cannot clean up. The leader watches
//!    the chunks its state holds that no leader has reported (every chunk with a group has a
//!    leader reporting its size every few seconds) and are not moving; once one has been so
//!    for [`abandoned_after`] (five minutes), it asks every node of the cluster for its
//!    catalog, and forgets the chunk if every node answered and none names it. A node that
//!    does not answer stops the pass (its catalog may name the chunk) until a tenth of that
//!    time later. The pass runs in a task of its own, beside the node's reports.
//!
//! A coordinator still at work cannot lose its placements to the leader's pass: it sends its
//! first catalog change within half of [`abandoned_after`] of its first placement, or forgets
//! its placements and refuses (rule 1), and the leader starts a chunk's grace again whenever a
//! coordinator places it or is answered that it is placed already (a creation retried under the
//! same id reuses the placements of one that died), so the catalog change reaches a node well
//! before the leader's pass could forget the chunk.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::time::{Duration, Instant};

use tundra_cluster::Command;
use tundra_store::ids::{ChunkId, VolumeId};

use crate::cluster::{ClusterNode, chunk_count};
use crate::messages::{Refusal, VolumeDef};

/// How long a placement no leader reports and no catalog names is kept.
const ABANDONED_AFTER: Duration = Duration::from_secs(300);

/// [`ABANDONED_AFTER`], or `TUNDRA_TEST_ABANDONED_AFTER_MS` in tests.
pub(crate) fn abandoned_after() -> Duration {
    let ms = std::env::var("TUNDRA_TEST_ABANDONED_AFTER_MS").ok().and_then(|v| v.parse::<u64>().ok());
    ms.map_or(ABANDONED_AFTER, Duration::from_millis)
}

/// A test-only hook: `TUNDRA_TEST_KEEP_PLACEMENTS=coordinator` turns rule 1 off,
/// `=leader` rule 2 (the twins of this module). Unset in production.
fn keeps_placements_for_test(rule: &str) -> bool {
    std::env::var("TUNDRA_TEST_KEEP_PLACEMENTS").is_ok_and(|v| v == rule)
}

/// A test-only hook: `TUNDRA_TEST_CREATE_STOP_AFTER_PLACE=NAME` stops the creation of volume
/// NAME once its chunks are placed, leaving them as a coordinator killed there would. Unset in
/// production.
pub(crate) fn stops_after_place_for_test(name: &str) -> bool {
    std::env::var("TUNDRA_TEST_CREATE_STOP_AFTER_PLACE").is_ok_and(|v| v == name)
}

/// The refusal of a coordinator that took `elapsed` between its first placement and its first
/// catalog change, if that is too long (rule 1).
pub(crate) fn too_slow(elapsed: Duration, what: &str) -> Option<Refusal> {
    let limit = abandoned_after() / 2;
    (elapsed > limit).then(|| {
        Refusal::Unavailable(format!(
            "{what} took over {} s from its placement to the nodes' catalogs; its placements were given back \
             and nothing was changed: run it again",
            limit.as_secs()
        ))
    })
}

/// The chunks of `volume` each catalog names: those of its size as entered, which a resize
/// that reached the node grew already. The catalogs are peers' answers: counted, not listed.
fn named(defs: &[VolumeDef], volume: u32) -> u64 {
    defs.iter()
        .filter(|def| def.id == volume)
        .map(|def| (def.chunks.len() as u64).max(chunk_count(def.size_bytes)))
        .max()
        .unwrap_or(0)
}

/// What the manager's leader watches between its rounds (rule 2); kept in its memory, so a
/// new leader watches from the start again. A coordinator's placement of a chunk, new or found
/// placed already (a retried creation takes the same id), starts the chunk's watch again.
#[derive(Default)]
pub(crate) struct Watch {
    /// The chunks no leader reported, and since when this leader has seen them so.
    unreported_since: BTreeMap<ChunkId, Instant>,
    /// When the catalogs may be asked again: a tenth of [`abandoned_after`] after the last
    /// time (at least a second), so that a node down does not make every round wait for it.
    next_ask: Option<Instant>,
}

impl Watch {
    /// A coordinator placed `chunk`, or was answered that it is placed: its grace starts now.
    pub(crate) fn placed(&mut self, chunk: ChunkId) {
        self.unreported_since.insert(chunk, Instant::now());
    }
}

impl ClusterNode {
    /// Rule 1: the manager forgets chunks `indexes` of `volume`, placed by a creation or resize
    /// that stopped before any node's catalog named them. Best effort: a chunk unknown to the
    /// manager is forgotten already, and one left by a failure here is rule 2's.
    pub(crate) async fn forget_placed(&self, volume: u32, indexes: Range<u32>) {
        if keeps_placements_for_test("coordinator") {
            return;
        }
        for index in indexes {
            let chunk = ChunkId::new(VolumeId(volume), index);
            if let Err(Refusal::Unavailable(why)) = self.manager_command(&Command::DeleteChunk { chunk }).await {
                eprintln!(
                    "tundra: node {}: the placement of chunk {index} of volume id {volume} stays for now ({why}); \
                     the manager's leader forgets it later",
                    self.me
                );
                return;
            }
        }
    }

    /// Rule 2, one round on the manager's leader: the chunks that have been unreported and
    /// named by no catalog for [`abandoned_after`] forgotten.
    pub(crate) async fn forget_abandoned(&self) {
        let Some(view) = self.host.manager_view() else { return };
        let unreported: BTreeSet<ChunkId> = {
            let view = view.lock();
            let chunks = view.state.chunks();
            chunks.iter().filter(|(_, c)| c.reported.is_none() && c.moving.is_none()).map(|(&id, _)| id).collect()
        };
        let now = Instant::now();
        let after = abandoned_after();
        let due: Vec<ChunkId> = {
            let mut watch = self.placements.lock();
            watch.unreported_since.retain(|chunk, _| unreported.contains(chunk));
            for &chunk in &unreported {
                watch.unreported_since.entry(chunk).or_insert(now);
            }
            let due: Vec<ChunkId> =
                watch.unreported_since.iter().filter(|(_, since)| since.elapsed() >= after).map(|(&c, _)| c).collect();
            if due.is_empty() || keeps_placements_for_test("leader") || watch.next_ask.is_some_and(|at| now < at) {
                return;
            }
            watch.next_ask = Some(now + (after / 10).max(Duration::from_secs(1)));
            due
        };
        let mut catalogs = Vec::new();
        for node in self.membership.ids() {
            // A node that does not answer may name the chunks: try again later.
            let Some(defs) = self.catalog_of(node).await else { return };
            catalogs.push(defs);
        }
        for chunk in due {
            let (volume, index) = (chunk.volume().0, chunk.index());
            if catalogs.iter().any(|defs| u64::from(index) < named(defs, volume)) {
                // A volume whose group has no leader yet (its nodes down): not abandoned.
                self.placements.lock().placed(chunk);
                continue;
            }
            // Placed again by a coordinator while the catalogs were asked: its grace restarted.
            if self.placements.lock().unreported_since.get(&chunk).is_none_or(|since| since.elapsed() < after) {
                continue;
            }
            match self.manager_command(&Command::DeleteChunk { chunk }).await {
                Ok(()) => {
                    self.placements.lock().unreported_since.remove(&chunk);
                    eprintln!(
                        "tundra: node {}: forgot the placement of chunk {index} of volume id {volume}: no node's \
                         catalog names it {} s after it was placed (a creation or resize stopped half way)",
                        self.me,
                        after.as_secs()
                    );
                }
                Err(_) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(id: u32, size_bytes: u64, chunks: usize) -> VolumeDef {
        VolumeDef::for_test(id, &format!("v{id}"), size_bytes, chunks)
    }

    #[test]
    fn a_catalog_names_the_chunks_of_its_volumes_size_and_no_other_volumes() {
        let gib = 1u64 << 30;
        let defs = vec![def(1, 3 * gib, 3), def(2, gib / 2, 1)];
        assert_eq!(named(&defs, 1), 3);
        assert_eq!(named(&defs, 2), 1);
        assert_eq!(named(&defs, 7), 0, "a volume the catalog lacks names nothing");
        // A resize grew the size on this node: its new chunks are named.
        assert_eq!(named(&[def(1, 5 * gib, 5)], 1), 5);
    }

    #[test]
    fn a_chunk_placed_again_starts_its_grace_again() {
        let mut watch = Watch::default();
        let chunk = ChunkId::new(VolumeId(3), 0);
        let first = Instant::now();
        watch.unreported_since.insert(chunk, first);
        std::thread::sleep(Duration::from_millis(2));
        watch.placed(chunk);
        assert!(watch.unreported_since[&chunk] > first);
    }

    #[test]
    fn a_coordinator_past_half_the_wait_gives_its_placements_back() {
        assert!(too_slow(Duration::from_secs(1), "the creation").is_none());
        let refusal = too_slow(abandoned_after() / 2 + Duration::from_millis(1), "the creation").expect("refused");
        assert!(refusal.to_string().contains("run it again"), "{refusal}");
    }
}
