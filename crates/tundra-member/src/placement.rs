//! Where a new replicated volume's chunks go (seed 000 §4.2.1), decided by tundra-cluster's
//! placement and nothing else: a `ClusterState` is built from every node's reported drive
//! space (`AddNode` and `Heartbeat` per node) and each chunk is placed with `PlaceChunk`, which
//! chooses the nodes of lowest logical usage that the chunk keeps under the fullness limit
//! (75%) on both axes, and answers `Full` when too few qualify. Chunks placed earlier in the
//! same volume count against their nodes, so a volume's chunks spread over the cluster.

use tundra_cluster::{Applied, ClusterState, Command, ManagerConfig, NodeId, Policy, Space};
use tundra_store::ids::{ChunkId, VolumeId};

use crate::messages::NodeUsage;

/// The replica sets of a volume's chunks, by chunk index, each lowest node id first.
/// `chunk_bytes` are the chunks' spans in the volume (each the logical bytes placement expects
/// the chunk to hold once full).
pub fn place_volume(
    volume: u32,
    nodes: &[(u64, NodeUsage)],
    chunk_bytes: &[u64],
    replicas: usize,
) -> Result<Vec<Vec<u64>>, String> {
    let mut config = ManagerConfig::paper(Policy::Logical);
    config.replicas = replicas;
    let mut state = ClusterState::new(config).map_err(|e| e.message().to_string())?;
    for &(id, usage) in nodes {
        let capacity = Space::new(usage.logical_capacity_bytes, usage.physical_capacity_bytes);
        let used = Space::new(usage.logical_used_bytes, usage.physical_used_bytes);
        let node = NodeId(id);
        let joined = state.apply(&Command::AddNode { node, capacity });
        let reported = joined.and_then(|_| state.apply(&Command::Heartbeat { node, capacity, used }));
        reported.map_err(|e| format!("node {id}: {}", e.message()))?;
    }
    let mut sets = Vec::with_capacity(chunk_bytes.len());
    for (index, &bytes) in chunk_bytes.iter().enumerate() {
        let chunk = ChunkId::new(VolumeId(volume), index as u32);
        let placed = state
            .apply(&Command::PlaceChunk { chunk, expected_logical_bytes: bytes })
            .map_err(|e| format!("chunk {index} cannot be placed: {}", e.message()))?;
        let Applied::Placed(chosen) = placed else { unreachable!("placement answers the nodes it chose") };
        let mut set: Vec<u64> = chosen.into_iter().map(|n| n.0).collect();
        set.sort_unstable();
        sets.push(set);
    }
    Ok(sets)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn usage(logical_used: u64) -> NodeUsage {
        NodeUsage {
            logical_capacity_bytes: 8 * GIB,
            physical_capacity_bytes: 4 * GIB,
            logical_used_bytes: logical_used,
            physical_used_bytes: logical_used / 4,
        }
    }

    #[test]
    fn chunks_go_to_the_least_used_nodes_and_spread() {
        let nodes: Vec<(u64, NodeUsage)> = (1..=5).map(|id| (id, usage(if id == 2 { 4 * GIB } else { 0 }))).collect();
        let sets = place_volume(7, &nodes, &[GIB, GIB, GIB], 3).expect("placed");
        assert_eq!(sets.len(), 3);
        for set in &sets {
            assert_eq!(set.len(), 3);
            assert!(!set.contains(&2), "node 2 is the fullest: {sets:?}");
        }
        // Chunk 0 fills nodes 1, 3, 4, so chunk 1 starts with node 5.
        assert_eq!(sets[0], vec![1, 3, 4]);
        assert!(sets[1].contains(&5));
    }

    #[test]
    fn a_full_cluster_is_refused_with_a_reason() {
        let nodes: Vec<(u64, NodeUsage)> = (1..=4).map(|id| (id, usage(5 * GIB))).collect();
        let error = place_volume(7, &nodes, &[2 * GIB], 3).expect_err("no node keeps under 75%");
        assert!(error.contains("0 of 4 active nodes"), "{error}");
        let error = place_volume(7, &nodes[..2], &[GIB], 3).expect_err("two nodes for three replicas");
        assert!(error.contains("replicas need 3"), "{error}");
    }
}
