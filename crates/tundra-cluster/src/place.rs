//! Placement of a new chunk (seed 000 §4.2.1): its replicas go to the nodes with the lowest
//! logical usage, each on a different node, and never to a node that the chunk would take past
//! the fullness limit (75%) on either axis. When too few nodes qualify the cluster is full, and
//! the error says how far from placing the chunk it is.

use crate::error::{Error, Result};
use crate::state::{ClusterState, NodeState, NodeStatus};
use crate::usage::{NodeId, Space};

impl ClusterState {
    /// The nodes a chunk of `size` would be placed on, best first; nothing changes.
    pub fn choose_replicas(&self, size: Space) -> Result<Vec<NodeId>> {
        self.choose_replicas_except(size, &[])
    }

    /// [`ClusterState::choose_replicas`] among the nodes not in `unknown` (nodes whose reports
    /// are stale: their usage is not known, so they take nothing).
    pub fn choose_replicas_except(&self, size: Space, unknown: &[NodeId]) -> Result<Vec<NodeId>> {
        let wanted = self.config.replicas;
        let chosen = self.lowest_logical(size, wanted, |id| !unknown.contains(&id));
        if chosen.len() == wanted { Ok(chosen) } else { Err(self.full_error(size, chosen.len(), unknown)) }
    }

    /// Up to `count` active nodes that `size` fits on and that `allowed` accepts, lowest logical
    /// usage first (ties by node id, so every member chooses alike). One pass over the nodes
    /// keeping the best few: placement runs for every chunk of a large cluster.
    pub(crate) fn lowest_logical(&self, size: Space, count: usize, allowed: impl Fn(NodeId) -> bool) -> Vec<NodeId> {
        let mut best: Vec<(f64, NodeId)> = Vec::with_capacity(count + 1);
        for (&id, node) in &self.nodes {
            if !node.takes_part() || !allowed(id) || !self.fits(node, size) {
                continue;
            }
            let key = (logical_fraction(node), id);
            if best.len() == count && !before(key, *best.last().expect("count is at least 1")) {
                continue;
            }
            let at = best.partition_point(|&other| before(other, key));
            best.insert(at, key);
            best.truncate(count);
        }
        best.into_iter().map(|(_, id)| id).collect()
    }

    fn full_error(&self, size: Space, eligible: usize, unknown: &[NodeId]) -> Error {
        let active: Vec<NodeId> = self
            .nodes
            .iter()
            .filter(|(id, n)| n.status == NodeStatus::Active && !n.unknown && !unknown.contains(id))
            .map(|(id, _)| *id)
            .collect();
        let silent: Vec<String> = self
            .nodes
            .iter()
            .filter(|(id, n)| n.status == NodeStatus::Active && (n.unknown || unknown.contains(id)))
            .map(|(id, _)| id.0.to_string())
            .collect();
        let silent = if silent.is_empty() {
            String::new()
        } else {
            format!(
                " (unknown, their last report older than {} ms: node {})",
                crate::mover::REPORT_STALE_AFTER_MS,
                silent.join(", ")
            )
        };
        Error::full(format!(
            "{eligible} of {} active nodes can take a chunk of {} logical bytes without passing {:.0}% of \
             their logical or physical capacity, and {} replicas need {}{silent}; add nodes",
            active.len(),
            size.logical_bytes,
            100.0 * self.config.fullness_limit,
            self.config.replicas,
            self.config.replicas
        ))
    }
}

pub(crate) fn logical_fraction(node: &NodeState) -> f64 {
    node.projected().fractions_of(node.capacity).0
}

fn before(a: (f64, NodeId), b: (f64, NodeId)) -> bool {
    a.0 < b.0 || (a.0 == b.0 && a.1 < b.1)
}
