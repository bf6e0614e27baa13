//! The rules that choose moves, each a method of the planner: evacuation (repair of a dead
//! node's chunks, drain), the logical rule of seed 000 §4.2.1 (off nodes above the average, onto
//! new nodes below it) and the zones of §4.2.2.

use std::cmp::Ordering;

use tundra_store::ids::ChunkId;

use super::{Measure, MoveReason, Planner};
use crate::config::Policy;
use crate::state::NodeStatus;
use crate::usage::{NodeId, Space, Zone};

thread_local! {
    /// A test-only switch ([`set_zone_takes_for_test`]): off, a node that cannot send never
    /// takes.
    static TAKES: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
}

/// Turns the taking half of the zone moves off (or on again) for plans made on this thread: the
/// twin of the test that nodes filled in one era are brought into the band. Not for production.
#[doc(hidden)]
pub fn set_zone_takes_for_test(on: bool) {
    TAKES.with(|t| t.set(on));
}

/// How many of the best-placed nodes a rule tries as targets (or sources) for one move; the
/// first that passes the checks takes it, so a larger number only costs time on a cluster
/// where most nodes are refused.
const NODES_TRIED: usize = 16;

impl Planner<'_> {
    /// Every chunk of every node in `status` moves to the active node with the lowest logical
    /// usage that can take it.
    pub(super) fn evacuate(&mut self, status: NodeStatus, reason: MoveReason) {
        let sources: Vec<NodeId> =
            self.state.nodes.iter().filter(|(_, n)| n.status == status).map(|(id, _)| *id).collect();
        for from in sources {
            let chunks: Vec<(ChunkId, Space)> = self.movable(from).collect();
            for (chunk, size) in chunks {
                if self.full() || !self.node_free(from) {
                    break;
                }
                let target = self
                    .active()
                    .filter(|&to| self.may_receive(to, chunk, size))
                    .min_by(|&a, &b| by_fraction(self.logical_fraction(a), a, self.logical_fraction(b), b));
                if let Some(to) = target {
                    self.add(chunk, from, to, reason);
                }
            }
        }
    }

    /// Seed 000 §4.2.1: a node whose logical usage is more than the margin above the average
    /// sends chunks to the nodes with the lowest logical usage.
    pub(super) fn logical_over(&mut self) {
        let mut sources: Vec<(f64, NodeId)> =
            self.active().map(|n| (self.measures(n).over, n)).filter(|(over, _)| *over > 0.0).collect();
        sources.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        for (_, from) in sources {
            while !self.full() && self.node_free(from) && self.measures(from).over > 0.0 {
                let targets = self.by_logical_fraction(false);
                if !self.try_move(from, &targets, Measure::Over, MoveReason::LogicalOver) {
                    break;
                }
            }
        }
    }

    /// A node whose logical usage is more than the margin below the average (one that just
    /// joined) receives chunks from the nodes with the highest logical usage.
    pub(super) fn logical_under(&mut self) {
        let mut targets: Vec<(f64, NodeId)> =
            self.active().map(|n| (self.measures(n).under, n)).filter(|(under, _)| *under > 0.0).collect();
        targets.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        for (_, to) in targets {
            'fill: while !self.full() && self.node_free(to) && self.measures(to).under > 0.0 {
                for from in self.by_logical_fraction(true) {
                    if from != to && self.try_move(from, &[to], Measure::Under, MoveReason::LogicalUnder) {
                        continue 'fill;
                    }
                }
                break;
            }
        }
    }

    /// Seed 000 §4.2.2: a node in zone A sends its lowest-ratio chunks to nodes in zones D, C or
    /// B, in that order of preference; a node in zone D sends its highest-ratio chunks to zones
    /// A, B or C. Within a zone, the node furthest from the source's side of the band comes
    /// first.
    ///
    /// A node that cannot send (every such move would take it more than the logical margin
    /// under the average, as for a node that joined and filled with one kind of data) takes a
    /// chunk instead: a node in zone A one of the highest-ratio chunks of a node in zone D or
    /// C, a node in zone D one of the lowest-ratio chunks of a node in zone A or B. Sending and
    /// taking in turn, the node exchanges chunks with the other side of the average and its
    /// logical usage stays within the margin. The paper names only the sending half; without
    /// the other, such nodes stay outside the band (docs/measurements.md, "eras").
    pub(super) fn zone_moves(&mut self) {
        for source_zone in [Zone::A, Zone::D] {
            let mut sources: Vec<(f64, NodeId)> = self
                .active()
                .filter_map(|n| self.ratio(n).map(|r| (r, n)))
                .filter(|&(_, n)| self.thresholds.zone(self.used(n)) == Some(source_zone))
                .collect();
            // The furthest outside the band first.
            sources.sort_by(|a, b| match source_zone {
                Zone::A => a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)),
                _ => b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)),
            });
            for (_, from) in sources {
                while !self.full() && self.node_free(from) && self.thresholds.zone(self.used(from)) == Some(source_zone)
                {
                    let targets = self.zone_targets(source_zone, from);
                    let reason = if source_zone == Zone::A { MoveReason::ZoneA } else { MoveReason::ZoneD };
                    let sent = self.try_zone_move(from, source_zone, &targets, reason);
                    let took =
                        !sent && TAKES.with(std::cell::Cell::get) && self.try_zone_take(from, source_zone, reason);
                    if !sent && !took {
                        break;
                    }
                }
            }
        }
    }

    /// The targets for a zone move off a node in `source_zone`, in the paper's order of
    /// preference.
    fn zone_targets(&self, source_zone: Zone, from: NodeId) -> Vec<NodeId> {
        let preference: [Zone; 3] =
            if source_zone == Zone::A { [Zone::D, Zone::C, Zone::B] } else { [Zone::A, Zone::B, Zone::C] };
        let mut targets: Vec<(usize, f64, NodeId)> = self
            .active()
            .filter(|&n| n != from && self.node_free(n))
            .filter_map(|n| {
                let zone = self.thresholds.zone(self.used(n))?;
                let rank = preference.iter().position(|&z| z == zone)?;
                Some((rank, self.ratio(n).expect("a node with a zone stores something"), n))
            })
            .collect();
        targets.sort_by(|a, b| {
            let ratio = if source_zone == Zone::A { b.1.total_cmp(&a.1) } else { a.1.total_cmp(&b.1) };
            a.0.cmp(&b.0).then(ratio).then(a.2.cmp(&b.2))
        });
        targets.truncate(4 * NODES_TRIED);
        targets.into_iter().map(|(_, _, n)| n).collect()
    }

    fn try_zone_move(&mut self, from: NodeId, source_zone: Zone, targets: &[NodeId], reason: MoveReason) -> bool {
        let source_ratio = self.ratio(from).expect("a node in a zone stores something");
        // Zone A sends its lowest-ratio chunks, zone D its highest.
        for (chunk, size) in self.zone_candidates(from, source_ratio, source_zone == Zone::D) {
            for &to in targets {
                if self.may_receive(to, chunk, size) && self.improves(from, to, size, Measure::Outside) {
                    self.add(chunk, from, to, reason);
                    return true;
                }
            }
        }
        false
    }

    /// The taking half of [`Planner::zone_moves`]: `to`, in `zone`, takes one of the chunks
    /// furthest on the other side of its ratio from the nodes furthest on that side: the
    /// targets a send from `to` would have, but for the last zone of their preference (zone D,
    /// then C, for a node in zone A; zone A, then B, for one in zone D).
    fn try_zone_take(&mut self, to: NodeId, zone: Zone, reason: MoveReason) -> bool {
        let own = self.ratio(to).expect("a node in a zone stores something");
        let last = if zone == Zone::A { Zone::B } else { Zone::C };
        let sources: Vec<NodeId> = self
            .zone_targets(zone, to)
            .into_iter()
            .filter(|&n| self.thresholds.zone(self.used(n)) != Some(last))
            .take(NODES_TRIED)
            .collect();
        for from in sources {
            // A node in zone A takes the highest-ratio chunks above its own, zone D the lowest.
            for (chunk, size) in self.zone_candidates(from, own, zone == Zone::A) {
                if self.may_receive(to, chunk, size) && self.improves(from, to, size, Measure::Outside) {
                    self.add(chunk, from, to, reason);
                    return true;
                }
            }
        }
        false
    }

    /// The chunks of `node` that may move with a ratio above `ratio` (`above`) or below it,
    /// furthest from it first, the first few.
    fn zone_candidates(&self, node: NodeId, ratio: f64, above: bool) -> Vec<(ChunkId, Space)> {
        let mut chunks: Vec<(f64, ChunkId, Space)> = self
            .movable(node)
            .filter_map(|(c, size)| size.ratio().map(|r| (r, c, size)))
            .filter(|&(r, _, _)| if above { r > ratio } else { r < ratio })
            .collect();
        chunks.sort_by(|a, b| {
            let order = if above { b.0.total_cmp(&a.0) } else { a.0.total_cmp(&b.0) };
            order.then(a.1.cmp(&b.1))
        });
        chunks.truncate(self.state.config.candidates_per_source);
        chunks.into_iter().map(|(_, c, size)| (c, size)).collect()
    }

    /// Tries the source's candidate chunks against `targets` in order and plans the first move
    /// that passes; false when none does.
    fn try_move(&mut self, from: NodeId, targets: &[NodeId], purpose: Measure, reason: MoveReason) -> bool {
        for (chunk, size) in self.balance_candidates(from) {
            for &to in targets {
                if to != from && self.may_receive(to, chunk, size) && self.improves(from, to, size, purpose) {
                    self.add(chunk, from, to, reason);
                    return true;
                }
            }
        }
        false
    }

    /// A source's chunks for the logical rule, in the policy's order: blind to ratios under the
    /// logical policy (largest first, as moving fewer chunks is cheaper), and under the
    /// compression-aware policy the chunks whose ratio is nearest the average first, so that
    /// balancing logical usage does not push nodes out of the band.
    fn balance_candidates(&self, from: NodeId) -> Vec<(ChunkId, Space)> {
        let mut chunks: Vec<(ChunkId, Space)> = self.movable(from).collect();
        match self.thresholds.policy {
            Policy::Logical => {
                chunks.sort_by(|a, b| b.1.logical_bytes.cmp(&a.1.logical_bytes).then(a.0.cmp(&b.0)));
            }
            Policy::CompressionAware => {
                let average = self.thresholds.ratio_average;
                let distance = |s: Space| s.ratio().map_or(f64::INFINITY, |r| (r - average).abs());
                chunks.sort_by(|a, b| distance(a.1).total_cmp(&distance(b.1)).then(a.0.cmp(&b.0)));
            }
        }
        chunks.truncate(self.state.config.candidates_per_source);
        chunks
    }

    /// Active nodes free to move, by logical usage (lowest first, or highest first), the first
    /// few.
    fn by_logical_fraction(&self, highest_first: bool) -> Vec<NodeId> {
        let mut nodes: Vec<(f64, NodeId)> =
            self.active().filter(|&n| self.node_free(n)).map(|n| (self.logical_fraction(n), n)).collect();
        nodes.sort_by(|a, b| {
            let order = by_fraction(a.0, a.1, b.0, b.1);
            if highest_first { order.reverse() } else { order }
        });
        nodes.truncate(NODES_TRIED);
        nodes.into_iter().map(|(_, n)| n).collect()
    }
}

fn by_fraction(a: f64, a_id: NodeId, b: f64, b_id: NodeId) -> Ordering {
    a.total_cmp(&b).then(a_id.cmp(&b_id))
}
