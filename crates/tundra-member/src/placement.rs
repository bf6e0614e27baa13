//! Where a new replicated volume's chunks go (seed 000 §4.2.1), decided by tundra-cluster's
//! placement and nothing else. In a running cluster the manager's leader places each chunk in
//! its replicated state (`PlaceChunkAt`, manager.rs), among the nodes whose reports are fresh,
//! and the thin-provisioning share below is counted from the same state's reports
//! ([`reported_usage`]). [`place_volume`] (for its tests and tools) builds a `ClusterState`
//! from given usage (`AddNode` and `Heartbeat` per node) and places each chunk with `PlaceChunk`, which
//! chooses the nodes of lowest logical usage that the chunk keeps under the fullness limit
//! (75%) on both axes, and answers `Full` when too few qualify. Chunks placed earlier in the
//! same volume count against their nodes, so a volume's chunks spread over the cluster.
//!
//! A chunk counts at its full size, uncompressed: the most it can come to hold. Where every
//! node's drive is overcommitted (`overcommit = true`: its operator lets volumes promise more
//! than the space, as thin provisioning does) and the volume's full size would not fit, each
//! chunk counts at the same fraction of its size instead, the fraction that fits the volume
//! into the room the nodes have under the limit: the chunks still spread as their sizes say,
//! and a write fails with no space only once the pages themselves no longer fit, as on a node
//! alone.

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
    let share = overcommitted_share(nodes, chunk_bytes, replicas);
    let mut sets = Vec::with_capacity(chunk_bytes.len());
    for (index, &bytes) in chunk_bytes.iter().enumerate() {
        let chunk = ChunkId::new(VolumeId(volume), index as u32);
        let expected = ((bytes as f64 * share) as u64).max(1);
        let placed = state
            .apply(&Command::PlaceChunk { chunk, expected_logical_bytes: expected })
            .map_err(|e| format!("chunk {index} cannot be placed: {}", e.message()))?;
        let Applied::Placed(chosen) = placed else { unreachable!("placement answers the nodes it chose") };
        let mut set: Vec<u64> = chosen.into_iter().map(|n| n.0).collect();
        set.sort_unstable();
        sets.push(set);
    }
    Ok(sets)
}

/// The usage of every active node whose report in the manager's replicated state is fresh at
/// `now_unix_ms`, as the nodes reported it (for [`overcommitted_share`]).
pub(crate) fn reported_usage(state: &ClusterState, now_unix_ms: u64) -> Vec<(u64, NodeUsage)> {
    state
        .nodes()
        .iter()
        .filter(|(_, n)| n.status == tundra_cluster::NodeStatus::Active)
        .filter(|(_, n)| !tundra_cluster::mover::report_stale(n.reported_unix_ms, now_unix_ms))
        .filter_map(|(id, n)| {
            let used = n.reported_used?;
            let usage = NodeUsage {
                logical_capacity_bytes: n.capacity.logical_bytes,
                physical_capacity_bytes: n.capacity.physical_bytes,
                logical_used_bytes: used.logical_bytes,
                physical_used_bytes: used.physical_bytes,
                overcommit: n.overcommit,
            };
            Some((id.0, usage))
        })
        .collect()
}

/// The fraction of its size each chunk counts at: 1, unless every node is overcommitted and the
/// volume's replicas at full size pass the room under the fullness limit on either axis; then
/// the fraction that fits them in nine tenths of that room.
pub(crate) fn overcommitted_share(nodes: &[(u64, NodeUsage)], chunk_bytes: &[u64], replicas: usize) -> f64 {
    if nodes.is_empty() || !nodes.iter().all(|(_, usage)| usage.overcommit) {
        return 1.0;
    }
    let limit = ManagerConfig::PAPER_FULLNESS_LIMIT;
    let room = |capacity: u64, used: u64| (limit * capacity as f64 - used as f64).max(0.0);
    let logical: f64 = nodes.iter().map(|(_, u)| room(u.logical_capacity_bytes, u.logical_used_bytes)).sum();
    let physical: f64 = nodes.iter().map(|(_, u)| room(u.physical_capacity_bytes, u.physical_used_bytes)).sum();
    let needed = chunk_bytes.iter().sum::<u64>() as f64 * replicas as f64;
    let fits = 0.9 * logical.min(physical);
    if needed <= fits || needed == 0.0 { 1.0 } else { fits / needed }
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
            overcommit: false,
        }
    }

    #[test]
    fn overcommitted_nodes_take_a_volume_beyond_their_space_spread_as_its_chunks_sizes_say() {
        let thin = |id| (id, NodeUsage { overcommit: true, ..usage(0) });
        let nodes: Vec<(u64, NodeUsage)> = (1..=5).map(thin).collect();
        let chunks = vec![GIB; 40];
        let sets = place_volume(7, &nodes, &chunks, 3).expect("thin provisioning places it");
        let mut per_node = [0usize; 5];
        for set in &sets {
            assert_eq!(set.len(), 3);
            for &n in set {
                per_node[n as usize - 1] += 1;
            }
        }
        assert_eq!(per_node.iter().sum::<usize>(), 120);
        assert!(per_node.iter().all(|&n| n == 24), "spread evenly: {per_node:?}");
        // One node that does not overcommit: the volume's full size counts, and it does not fit.
        let mut strict = nodes.clone();
        strict[0].1.overcommit = false;
        let error = place_volume(7, &strict, &chunks, 3).expect_err("no thin provisioning");
        assert!(error.contains("cannot be placed"), "{error}");
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
