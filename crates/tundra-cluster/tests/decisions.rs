//! The manager's decisions under random clusters (proptest): placement never puts two replicas
//! of a chunk on one node nor passes the fullness limit, and says when the cluster is full;
//! repeated plans converge without oscillating under both policies; a drain empties its node and
//! a dead node's chunks are copied again; refused commands change nothing; plans keep the
//! throttle and one membership change per chunk. Each oracle has a twin that feeds it the fault
//! it guards against and expects it to fail.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use tundra_cluster::{
    ChunkId, ClusterState, Command, ErrorKind, ManagerConfig, Move, NodeId, NodeStatus, Policy, Space, Thresholds,
};

const GIB: u64 = 1 << 30;

/// A random cluster: nodes with capacities of a few sizes, chunks placed by the manager then
/// reported with random ratios (a mix of low, average and high), some nodes joining late.
#[derive(Clone, Debug)]
struct Scenario {
    node_sizes: Vec<u64>,
    late_nodes: usize,
    chunks: Vec<(u64, u32)>,
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        prop::collection::vec(prop::sample::select(vec![400u64, 600, 800]), 4..14),
        0usize..3,
        prop::collection::vec((1u64..=10, prop::sample::select(vec![110u32, 180, 250, 300, 350, 420, 600])), 10..120),
    )
        .prop_map(|(node_sizes, late_nodes, chunks)| Scenario { node_sizes, late_nodes, chunks })
}

fn config(policy: Policy) -> ManagerConfig {
    let mut config = ManagerConfig::paper(policy);
    config.throttle.max_moves = 8;
    config
}

/// Builds the scenario's cluster; returns it with the chunks that were placed.
fn build(s: &Scenario, policy: Policy) -> ClusterState {
    let mut state = ClusterState::new(config(policy)).unwrap();
    let early = s.node_sizes.len() - s.late_nodes.min(s.node_sizes.len() - 3);
    for (i, &gib) in s.node_sizes.iter().enumerate().take(early) {
        state
            .apply(&Command::AddNode { node: NodeId(i as u64), capacity: Space::new(3 * gib * GIB, gib * GIB) })
            .unwrap();
    }
    for (i, &(gib, ratio_percent)) in s.chunks.iter().enumerate() {
        let chunk = ChunkId(i as u64);
        let logical = gib * GIB;
        if state.apply(&Command::PlaceChunk { chunk, expected_logical_bytes: logical }).is_err() {
            continue;
        }
        let physical = logical * 100 / u64::from(ratio_percent);
        state.apply(&Command::ChunkStats { chunk, size: Space::new(logical, physical) }).unwrap();
    }
    for (i, &gib) in s.node_sizes.iter().enumerate().skip(early) {
        state
            .apply(&Command::AddNode { node: NodeId(i as u64), capacity: Space::new(3 * gib * GIB, gib * GIB) })
            .unwrap();
    }
    state.check_invariants();
    state
}

/// No node past the limit on either axis, no chunk with two replicas on one node (the set would
/// hide it, so each node's list is counted too).
fn placement_problem(state: &ClusterState, limit: f64) -> Option<String> {
    for (id, node) in state.nodes() {
        let (logical, physical) = node.projected().fractions_of(node.capacity);
        if logical > limit || physical > limit {
            return Some(format!("{id} at {logical:.3} logical, {physical:.3} physical"));
        }
    }
    let mut copies: BTreeMap<ChunkId, usize> = BTreeMap::new();
    for node in state.nodes().values() {
        for c in &node.chunks {
            *copies.entry(*c).or_default() += 1;
        }
    }
    for (c, chunk) in state.chunks() {
        if copies.get(c).copied().unwrap_or(0) != chunk.replicas.len() || chunk.replicas.len() != 3 {
            return Some(format!(
                "chunk {} has {} copies for {:?}",
                c.0,
                copies.get(c).copied().unwrap_or(0),
                chunk.replicas
            ));
        }
    }
    None
}

fn totals(state: &ClusterState) -> (f64, f64, f64) {
    let t: Thresholds = state.thresholds();
    state.nodes().values().filter(|n| n.status == NodeStatus::Active).fold((0.0, 0.0, 0.0), |acc, n| {
        let m = t.measures(n.projected(), n.capacity);
        (acc.0 + m.over, acc.1 + m.under, acc.2 + m.outside)
    })
}

/// Plans and carries them out until a plan is empty; checks every round that the measures
/// only fall and that no placement of the chunks repeats. Returns the moves made.
fn settle(state: &mut ClusterState, rounds: usize) -> Result<Vec<Move>, String> {
    let mut seen = BTreeSet::new();
    let mut moves = Vec::new();
    let mut before = totals(state);
    for _ in 0..rounds {
        let plan = state.plan();
        if plan.moves.is_empty() {
            return Ok(moves);
        }
        check_plan(state, &plan.moves)?;
        for m in &plan.moves {
            state.apply(&Command::BeginMove(*m)).map_err(|e| e.to_string())?;
        }
        for m in &plan.moves {
            state.apply(&Command::FinishMove { chunk: m.chunk }).map_err(|e| e.to_string())?;
        }
        state.check_invariants();
        moves.extend(plan.moves.iter().copied());
        let placement: Vec<(ChunkId, Vec<NodeId>)> =
            state.chunks().iter().map(|(c, s)| (*c, s.replicas.iter().copied().collect())).collect();
        if !seen.insert(placement) {
            return Err("a placement repeated: the plans oscillate".into());
        }
        let after = totals(state);
        let balancing = plan
            .moves
            .iter()
            .all(|m| !matches!(m.reason, tundra_cluster::MoveReason::Repair | tundra_cluster::MoveReason::Drain));
        if balancing && !(after.0 <= before.0 && after.1 <= before.1 && after.2 <= before.2 && after != before) {
            return Err(format!("measures went from {before:?} to {after:?}"));
        }
        before = after;
    }
    Err(format!("no empty plan after {rounds} rounds"))
}

/// One membership change per chunk, the throttle, no move into a node that is not active.
fn check_plan(state: &ClusterState, moves: &[Move]) -> Result<(), String> {
    let throttle = state.config().throttle;
    let mut chunks = BTreeSet::new();
    let mut per_node: BTreeMap<NodeId, usize> = BTreeMap::new();
    for m in moves {
        if !chunks.insert(m.chunk) {
            return Err(format!("chunk {} moves twice in one plan", m.chunk.0));
        }
        *per_node.entry(m.to).or_default() += 1;
        if state.node(m.from).unwrap().status != NodeStatus::Dead {
            *per_node.entry(m.from).or_default() += 1;
        }
        if state.node(m.to).unwrap().status != NodeStatus::Active {
            return Err(format!("a move into {} which is not active", m.to));
        }
    }
    if moves.len() > throttle.max_moves || per_node.values().any(|&n| n > throttle.max_moves_per_node) {
        return Err(format!("the plan passes the throttle: {} moves, {per_node:?}", moves.len()));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn placement_keeps_replicas_apart_and_under_the_limit(s in scenario()) {
        let mut state = build(&s, Policy::Logical);
        prop_assert_eq!(placement_problem(&state, 0.75), None);
        // Fill until the manager says the cluster is full; the refusal changes nothing.
        for i in 0..10_000u64 {
            let before = state.clone();
            match state.apply(&Command::PlaceChunk { chunk: ChunkId(1_000_000 + i), expected_logical_bytes: 8 * GIB }) {
                Ok(_) => prop_assert_eq!(placement_problem(&state, 0.75), None),
                Err(e) => {
                    prop_assert_eq!(e.kind(), ErrorKind::Full);
                    prop_assert!(e.message().contains("add nodes"), "{}", e);
                    prop_assert_eq!(&state, &before);
                    return Ok(());
                }
            }
        }
        prop_assert!(false, "the cluster never filled");
    }

    #[test]
    fn plans_converge_without_oscillating(s in scenario(), aware in any::<bool>()) {
        let policy = if aware { Policy::CompressionAware } else { Policy::Logical };
        let mut state = build(&s, policy);
        let moves = settle(&mut state, 2_000);
        prop_assert!(moves.is_ok(), "{:?}", moves.err());
        prop_assert_eq!(placement_problem(&state, 0.75), None);
    }

    #[test]
    fn a_drain_empties_its_node(s in scenario(), pick in any::<prop::sample::Index>()) {
        let mut state = build(&s, Policy::CompressionAware);
        let node = *pick.get(&state.nodes().keys().copied().collect::<Vec<_>>());
        let hosted = state.node(node).unwrap().chunks.len();
        state.apply(&Command::DrainNode { node }).unwrap();
        let moves = settle(&mut state, 2_000).map_err(TestCaseError::fail)?;
        let left = state.node(node).unwrap().chunks.len();
        // A drain can only fail to finish for lack of room elsewhere, which the plan shows by
        // leaving chunks; with these capacities there is room unless the cluster was nearly full.
        if left == 0 {
            prop_assert!(moves.iter().filter(|m| m.from == node).count() >= hosted);
            let removed = state.apply(&Command::RemoveNode { node });
            prop_assert!(removed.is_ok(), "{:?}", removed);
        } else {
            prop_assert!(state.nodes().values().filter(|n| n.status == NodeStatus::Active)
                .all(|n| n.projected().fractions_of(n.capacity).0 > 0.5 || n.projected().fractions_of(n.capacity).1 > 0.5));
            prop_assert_eq!(state.apply(&Command::RemoveNode { node }).unwrap_err().kind(), ErrorKind::Conflict);
        }
    }

    #[test]
    fn a_dead_nodes_chunks_are_copied_again(s in scenario(), pick in any::<prop::sample::Index>()) {
        let mut state = build(&s, Policy::Logical);
        let node = *pick.get(&state.nodes().keys().copied().collect::<Vec<_>>());
        state.apply(&Command::NodeDead { node }).unwrap();
        settle(&mut state, 2_000).map_err(TestCaseError::fail)?;
        let stranded = state.node(node).unwrap().chunks.len();
        for (c, chunk) in state.chunks() {
            if !chunk.replicas.contains(&node) {
                prop_assert!(chunk.replicas.iter().all(|n| state.node(*n).unwrap().status == NodeStatus::Active), "chunk {}", c.0);
            }
        }
        if stranded > 0 {
            // Only a full cluster leaves a copy on the dead node.
            prop_assert!(state.plan().moves.is_empty());
        }
    }
}

#[test]
fn refused_commands_change_nothing() {
    let s = Scenario {
        node_sizes: vec![600; 6],
        late_nodes: 0,
        chunks: (0..30).map(|i| (4, [110, 350, 600][i % 3])).collect(),
    };
    let mut state = build(&s, Policy::CompressionAware);
    let chunk = ChunkId(0);
    let replicas: Vec<NodeId> = state.chunk(chunk).unwrap().replicas.iter().copied().collect();
    let outside = state.nodes().keys().copied().find(|n| !replicas.contains(n)).unwrap();
    let first = Move { chunk, from: replicas[0], to: outside, reason: tundra_cluster::MoveReason::LogicalOver };
    state.apply(&Command::BeginMove(first)).unwrap();
    let before = state.clone();
    let second = Move { from: replicas[1], ..first };
    let refusals = [
        (Command::BeginMove(second), ErrorKind::Conflict),
        (
            Command::BeginMove(Move { chunk, from: replicas[1], to: replicas[2], reason: first.reason }),
            ErrorKind::Conflict,
        ),
        (Command::PlaceChunk { chunk, expected_logical_bytes: GIB }, ErrorKind::Invalid),
        (Command::FinishMove { chunk: ChunkId(1) }, ErrorKind::Conflict),
        (Command::ChunkStats { chunk: ChunkId(999), size: Space::new(1, 1) }, ErrorKind::Invalid),
        (Command::AddNode { node: replicas[0], capacity: Space::new(1, 1) }, ErrorKind::Invalid),
        (Command::RemoveNode { node: replicas[0] }, ErrorKind::Conflict),
        (Command::DeleteChunk { chunk }, ErrorKind::Conflict),
        (
            Command::AdoptChunk { chunk, replicas: replicas.iter().copied().collect(), expected_logical_bytes: GIB },
            ErrorKind::Invalid,
        ),
        (
            Command::AdoptChunk {
                chunk: ChunkId(999),
                replicas: [NodeId(12345)].into_iter().collect(),
                expected_logical_bytes: GIB,
            },
            ErrorKind::Invalid,
        ),
        (
            Command::AdoptChunk { chunk: ChunkId(999), replicas: Default::default(), expected_logical_bytes: GIB },
            ErrorKind::Invalid,
        ),
    ];
    for (command, kind) in refusals {
        let error = state.apply(&command).unwrap_err();
        assert_eq!(error.kind(), kind, "{command:?}: {error}");
        assert_eq!(state, before, "{command:?} changed the state");
    }
    // Aborting puts the replica back where it was.
    state.apply(&Command::AbortMove { chunk }).unwrap();
    assert_eq!(state.chunk(chunk).unwrap().replicas.iter().copied().collect::<Vec<_>>(), replicas);
    state.check_invariants();
}

/// A manager rebuilt from the replicas the nodes report (chunks adopted, then heartbeats)
/// drains a node as one that placed the chunks itself would.
#[test]
fn adopted_chunks_are_counted_and_drained() {
    let mut state = ClusterState::new(config(Policy::Logical)).unwrap();
    let capacity = Space::new(8 * GIB, 4 * GIB);
    for id in 1..=5 {
        state.apply(&Command::AddNode { node: NodeId(id), capacity }).unwrap();
    }
    let sets: [&[u64]; 2] = [&[1, 2, 3], &[1, 4, 5]];
    for (index, set) in sets.iter().enumerate() {
        let replicas = set.iter().map(|&n| NodeId(n)).collect();
        state
            .apply(&Command::AdoptChunk { chunk: ChunkId(index as u64), replicas, expected_logical_bytes: GIB })
            .unwrap();
    }
    for id in 1..=5 {
        state.apply(&Command::Heartbeat { node: NodeId(id), capacity, used: Space::new(GIB / 2, GIB / 4) }).unwrap();
    }
    state.check_invariants();
    assert_eq!(state.node(NodeId(1)).unwrap().chunks.len(), 2);
    assert_eq!(state.node(NodeId(1)).unwrap().projected(), Space::new(2 * GIB, 2 * GIB));
    state.apply(&Command::DrainNode { node: NodeId(1) }).unwrap();
    let moves = state.plan().moves;
    assert_eq!(moves.len(), 2, "{moves:?}");
    for m in &moves {
        assert_eq!(m.from, NodeId(1));
        state.apply(&Command::BeginMove(*m)).unwrap();
        state.apply(&Command::FinishMove { chunk: m.chunk }).unwrap();
    }
    assert!(state.node(NodeId(1)).unwrap().chunks.is_empty());
    state.check_invariants();
}

#[test]
fn a_dead_target_aborts_the_moves_into_it() {
    let s = Scenario { node_sizes: vec![600; 5], late_nodes: 0, chunks: (0..12).map(|_| (4, 300)).collect() };
    let mut state = build(&s, Policy::Logical);
    let chunk = ChunkId(3);
    let replicas: Vec<NodeId> = state.chunk(chunk).unwrap().replicas.iter().copied().collect();
    let outside = state.nodes().keys().copied().find(|n| !replicas.contains(n)).unwrap();
    state
        .apply(&Command::BeginMove(Move {
            chunk,
            from: replicas[0],
            to: outside,
            reason: tundra_cluster::MoveReason::Drain,
        }))
        .unwrap();
    state.apply(&Command::NodeDead { node: outside }).unwrap();
    assert!(state.chunk(chunk).unwrap().moving.is_none());
    assert!(state.chunk(chunk).unwrap().replicas.contains(&replicas[0]));
    state.check_invariants();
}

/// Twin of the placement oracle: a manager allowed to fill nodes to 95% must be caught by the
/// 75% check.
#[test]
fn the_placement_oracle_catches_an_overfull_node() {
    let s = Scenario { node_sizes: vec![400; 4], late_nodes: 0, chunks: Vec::new() };
    let mut state = build(&s, Policy::Logical);
    let mut loose = *state.config();
    loose.fullness_limit = 0.95;
    state.apply(&Command::Configure(loose)).unwrap();
    for i in 0..1_000 {
        if state.apply(&Command::PlaceChunk { chunk: ChunkId(i), expected_logical_bytes: 8 * GIB }).is_err() {
            break;
        }
    }
    assert!(placement_problem(&state, 0.75).is_some());
}

/// Twin of the convergence oracle: a "plan" that sends a chunk back where it came from is
/// caught as oscillation (the placement repeats).
#[test]
fn the_convergence_oracle_catches_a_move_back() {
    let s = Scenario { node_sizes: vec![600; 5], late_nodes: 0, chunks: (0..12).map(|_| (4, 300)).collect() };
    let mut state = build(&s, Policy::Logical);
    let chunk = ChunkId(0);
    let replicas: Vec<NodeId> = state.chunk(chunk).unwrap().replicas.iter().copied().collect();
    let outside = state.nodes().keys().copied().find(|n| !replicas.contains(n)).unwrap();
    let reason = tundra_cluster::MoveReason::LogicalOver;
    let mut seen = BTreeSet::new();
    let mut repeated = false;
    for (from, to) in [(replicas[0], outside), (outside, replicas[0]), (replicas[0], outside)] {
        state.apply(&Command::BeginMove(Move { chunk, from, to, reason })).unwrap();
        state.apply(&Command::FinishMove { chunk }).unwrap();
        let placement: Vec<(ChunkId, Vec<NodeId>)> =
            state.chunks().iter().map(|(c, s)| (*c, s.replicas.iter().copied().collect())).collect();
        repeated |= !seen.insert(placement);
    }
    assert!(repeated);
}

/// The zones of §4.2.2 on a hand-made cluster: the zone A node sends its lowest-ratio chunk,
/// preferring a zone D target.
#[test]
fn a_zone_a_node_sends_its_lowest_ratio_chunk_to_zone_d() {
    // A wide logical margin keeps the logical rule out of this test.
    let mut wide = config(Policy::CompressionAware);
    wide.logical_margin = 0.5;
    let mut state = ClusterState::new(wide).unwrap();
    for n in 0..4 {
        state.apply(&Command::AddNode { node: NodeId(n), capacity: Space::new(300 * GIB, 100 * GIB) }).unwrap();
    }
    // Chunks on explicit nodes: place, then move replicas where the test wants them.
    let place = |state: &mut ClusterState, id: u64, ratio_percent: u64, on: [u64; 3]| {
        let chunk = ChunkId(id);
        state.apply(&Command::PlaceChunk { chunk, expected_logical_bytes: 10 * GIB }).unwrap();
        state
            .apply(&Command::ChunkStats { chunk, size: Space::new(10 * GIB, 10 * GIB * 100 / ratio_percent) })
            .unwrap();
        let want: BTreeSet<NodeId> = on.iter().map(|&n| NodeId(n)).collect();
        let have: BTreeSet<NodeId> = state.chunk(chunk).unwrap().replicas.clone();
        let leave: Vec<NodeId> = have.difference(&want).copied().collect();
        let join: Vec<NodeId> = want.difference(&have).copied().collect();
        for (from, to) in leave.into_iter().zip(join) {
            state
                .apply(&Command::BeginMove(Move { chunk, from, to, reason: tundra_cluster::MoveReason::Drain }))
                .unwrap();
            state.apply(&Command::FinishMove { chunk }).unwrap();
        }
    };
    // Node 0 holds low-ratio data (zone A), node 3 high-ratio data (zone D); 1 and 2 are mixed.
    place(&mut state, 0, 110, [0, 1, 2]);
    place(&mut state, 1, 150, [0, 1, 2]);
    place(&mut state, 2, 300, [0, 1, 3]);
    place(&mut state, 3, 600, [1, 2, 3]);
    place(&mut state, 4, 600, [0, 2, 3]);
    place(&mut state, 5, 300, [1, 2, 3]);
    let t = state.thresholds();
    let zone = |state: &ClusterState, n: u64| t.zone(state.node(NodeId(n)).unwrap().projected()).unwrap();
    assert_eq!(zone(&state, 0), tundra_cluster::Zone::A);
    assert_eq!(zone(&state, 3), tundra_cluster::Zone::D);
    let plan = state.plan();
    let first_zone_move =
        plan.moves.iter().find(|m| m.reason == tundra_cluster::MoveReason::ZoneA).expect("a zone A move");
    assert_eq!(first_zone_move.from, NodeId(0));
    assert_eq!(first_zone_move.chunk, ChunkId(0), "the lowest-ratio chunk leaves first");
    assert_eq!(first_zone_move.to, NodeId(3), "zone D is preferred");
}

/// Moves tried and refused (a target that held the chunk before) are excluded from later plans,
/// which go around them: a node that joined still receives chunks, others than the excluded.
#[test]
fn excluded_moves_are_never_planned_and_plans_go_around_them() {
    let s =
        Scenario { node_sizes: vec![600; 7], late_nodes: 1, chunks: (0..60).map(|i| (4, [180, 300][i % 2])).collect() };
    let state = build(&s, Policy::Logical);
    let newcomer = NodeId(6);
    let first = state.plan().moves;
    let into_newcomer: Vec<&Move> = first.iter().filter(|m| m.to == newcomer).collect();
    assert!(!into_newcomer.is_empty(), "the node that joined receives chunks: {first:?}");
    let excluded: BTreeSet<(ChunkId, NodeId)> = into_newcomer.iter().map(|m| (m.chunk, m.to)).collect();
    let second = state.plan_excluding(&excluded).moves;
    assert!(second.iter().all(|m| !excluded.contains(&(m.chunk, m.to))), "{second:?} plans an excluded move");
    assert!(second.iter().any(|m| m.to == newcomer), "the plan goes around the exclusions: {second:?}");
    // Repeated plans with the exclusions still converge, and never carry an excluded move out.
    let mut state = state;
    for _ in 0..200 {
        let moves = state.plan_excluding(&excluded).moves;
        if moves.is_empty() {
            return;
        }
        for m in &moves {
            assert!(!excluded.contains(&(m.chunk, m.to)));
            state.apply(&Command::BeginMove(*m)).unwrap();
            state.apply(&Command::FinishMove { chunk: m.chunk }).unwrap();
        }
    }
    panic!("plans with exclusions did not converge");
}
