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
        let wanted = self.config.replicas;
        let chosen = self.lowest_logical(size, wanted, |_| true);
        if chosen.len() == wanted { Ok(chosen) } else { Err(self.full_error(size, chosen.len())) }
    }

    /// Up to `count` active nodes that `size` fits on and that `allowed` accepts, lowest logical
    /// usage first (ties by node id, so every member chooses alike). One pass over the nodes
    /// keeping the best few: placement runs for every chunk of a large cluster.
    pub(crate) fn lowest_logical(&self, size: Space, count: usize, allowed: impl Fn(NodeId) -> bool) -> Vec<NodeId> {
        let mut best: Vec<(f64, NodeId)> = Vec::with_capacity(count + 1);
        for (&id, node) in &self.nodes {
            if node.status != NodeStatus::Active || !allowed(id) || !self.fits(node, size) {
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

    fn full_error(&self, size: Space, eligible: usize) -> Error {
        let active = self.nodes.values().filter(|n| n.status == NodeStatus::Active).count();
        Error::full(format!(
            "{eligible} of {active} active nodes can take a chunk of {} logical bytes without passing {:.0}% of \
             their logical or physical capacity, and {} replicas need {}; add nodes",
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
