//! The cluster manager's group in the simulation (seed 000 §4.2): three members on the
//! simulated network and memory logs, each with a snapshot store that survives its crashes,
//! snapshots every few entries (so logs are purged and lagging members are sent the state
//! whole), the leader crashed now and then (its log's unflushed tail lost) and restarted,
//! messages lost, duplicated and delayed. The leader proposes what a real manager proposes:
//! nodes joining, heartbeats, chunk stats, placements, drains and moves begun and ended.
//! Checked: every member applied the same command at each log index it applied, and at the end
//! every member holds the same `ClusterState`, whose invariants hold, and which holds every
//! placement the leader acknowledged.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tundra_cluster::{ChunkId, Command, Move, MoveReason, NodeId, Space};
use tundra_env::Rng;

use super::check::Applied;
use super::cluster::Cluster;
use super::net::{NetFaults, SimNet};
use crate::host::Host;
use crate::log::LogFault;
use crate::manager_machine::{ManagerBug, MemSnapshotStore, SnapshotStore, manager_group};
use crate::types::NodeId as RaftNodeId;

const GIB: u64 = 1 << 30;
/// A snapshot every this many entries: small, so that every run purges and installs.
const LOGS_PER_SNAPSHOT: u64 = 8;

pub struct ManagerReport {
    pub acknowledged: usize,
    pub crashes: usize,
    /// Whether some member's log was purged behind a snapshot.
    pub purged: bool,
    pub violations: Vec<String>,
}

/// What each member applied, by log index.
type Seen = Arc<Mutex<BTreeMap<u64, Vec<u8>>>>;

pub fn run(seed: u64, steps: usize, bug: ManagerBug) -> ManagerReport {
    crate::runtime::seed_thread_rng(seed ^ 0x3a7a);
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().expect("a runtime");
    runtime.block_on(simulate(seed, steps, bug))
}

async fn start_member(cluster: &Cluster, i: usize, stores: &[Arc<MemSnapshotStore>], seen: &[Seen], bug: ManagerBug) {
    let host = cluster.nodes[i].host.clone().expect("the node runs");
    let record = seen[i].clone();
    let hook: crate::manager_machine::ManagerHook =
        Arc::new(move |index, bytes| drop(record.lock().insert(index, bytes.to_vec())));
    // The injected bug lives on one member only: its state alone diverges.
    let bug = if i == 2 { bug } else { ManagerBug::None };
    let store: Arc<dyn SnapshotStore> = stores[i].clone();
    host.add_manager_group(store, Some(hook), bug, LOGS_PER_SNAPSHOT).await.expect("a manager member");
}

/// The command the leader proposes next, from its own state.
fn next_command(rng: &mut Rng, host: &Host, next_chunk: &mut u64) -> Command {
    let view = host.manager_view().expect("a member");
    let state = view.lock().state.clone();
    let nodes: Vec<NodeId> = state.nodes().keys().copied().collect();
    if nodes.len() < 5 {
        let node = NodeId(nodes.len() as u64 + 1);
        return Command::AddNode { node, capacity: Space::new(100 * GIB, 40 * GIB) };
    }
    let pick = rng.below(100);
    if pick < 25 {
        let node = nodes[rng.below(nodes.len() as u64) as usize];
        let used = Space::new(rng.below(50) * GIB, rng.below(20) * GIB);
        Command::Heartbeat { node, capacity: Space::new(100 * GIB, 40 * GIB), used }
    } else if pick < 50 || state.chunks().is_empty() {
        *next_chunk += 1;
        Command::PlaceChunk { chunk: ChunkId(1 << 32 | *next_chunk), expected_logical_bytes: GIB }
    } else if pick < 65 {
        let chunk = *state.chunks().keys().nth(rng.below(state.chunks().len() as u64) as usize).expect("a chunk");
        let logical = rng.range(1..GIB);
        Command::ChunkStats { chunk, size: Space::new(logical, logical / rng.range(1..5)) }
    } else if let Some(m) = state.moves_in_flight().next() {
        if rng.chance(0.5) { Command::FinishMove { chunk: m.chunk } } else { Command::AbortMove { chunk: m.chunk } }
    } else {
        let (&chunk, c) = state.chunks().iter().nth(rng.below(state.chunks().len() as u64) as usize).expect("a chunk");
        let from = *c.replicas.iter().next().expect("a replica");
        let to = nodes[rng.below(nodes.len() as u64) as usize];
        // Sometimes refused (a replica there already): a refusal must be alike everywhere.
        Command::BeginMove(Move { chunk, from, to, reason: MoveReason::Drain })
    }
}

async fn simulate(seed: u64, steps: usize, bug: ManagerBug) -> ManagerReport {
    let mut rng = Rng::new(seed);
    let faults = NetFaults { loss: 0.05, duplicate: 0.05, delay_max_ms: 20 };
    let net = SimNet::new(rng.fork(), faults, false);
    let applied = Arc::new(Mutex::new(Applied::default()));
    let mut cluster = Cluster::build(&mut rng, net, 3, 1, LogFault::None, applied, false).await;
    let stores: Vec<Arc<MemSnapshotStore>> = (0..3).map(|_| Arc::default()).collect();
    let seen: Vec<Seen> = (0..3).map(|_| Arc::default()).collect();
    for i in 0..3 {
        start_member(&cluster, i, &stores, &seen, bug).await;
    }
    let group = manager_group();
    let voters: BTreeSet<RaftNodeId> = (1..=3).collect();
    cluster.nodes[0].host.clone().expect("up").initialize(group, voters).await.expect("initialize");
    let mut report = ManagerReport { acknowledged: 0, crashes: 0, purged: false, violations: Vec::new() };
    let mut placed: Vec<ChunkId> = Vec::new();
    let mut next_chunk = 0u64;
    for _ in 0..steps {
        if let Some(down) = (0..3).find(|&i| !cluster.is_up(i)) {
            if rng.chance(0.3) {
                cluster.start(down).await.expect("restart");
                start_member(&cluster, down, &stores, &seen, bug).await;
            }
        } else if rng.chance(0.05)
            && let Some(leader) = cluster.leader(group)
        {
            cluster.crash((leader.id() - 1) as usize, &mut rng).await;
            report.crashes += 1;
        }
        if let Some(leader) = cluster.leader(group)
            && leader.settle(group, Duration::from_secs(2)).await.is_ok()
        {
            let command = next_command(&mut rng, &leader, &mut next_chunk);
            let proposal = tokio::time::timeout(Duration::from_secs(5), leader.propose_bytes(group, command.encode()));
            if let Ok(Ok(())) = proposal.await {
                report.acknowledged += 1;
                if let Command::PlaceChunk { chunk, .. } = command {
                    placed.push(chunk);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.range(1..40))).await;
    }
    for i in 0..3 {
        if !cluster.is_up(i) {
            cluster.start(i).await.expect("restart");
            start_member(&cluster, i, &stores, &seen, bug).await;
        }
    }
    cluster.net.set_faults(NetFaults { loss: 0.0, duplicate: 0.0, delay_max_ms: 0 });
    // One more command through a settled leader, then every member catches up with it.
    let target = loop {
        if let Some(leader) = cluster.leader(group)
            && leader.settle(group, Duration::from_secs(5)).await.is_ok()
            && leader.propose_bytes(group, Command::DrainNode { node: NodeId(1) }.encode()).await.is_ok()
        {
            break leader.raft(group).expect("a member").metrics().borrow().last_applied.map(|id| id.index);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let hosts: Vec<Arc<Host>> = (0..3).map(|i| cluster.nodes[i].host.clone().expect("up")).collect();
    for _ in 0..600 {
        let applied =
            |h: &Arc<Host>| h.raft(group).ok().and_then(|r| r.metrics().borrow().last_applied.map(|id| id.index));
        if hosts.iter().all(|h| applied(h) >= target) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    report.purged = hosts.iter().any(|h| h.log().with_group(group, |log| log.purged.is_some()));
    check(&hosts, &seen, &placed, &mut report.violations);
    cluster.shutdown().await;
    report
}

/// The checkers: the same command at each index everywhere, the same final state everywhere,
/// its invariants, and every acknowledged placement in it.
fn check(hosts: &[Arc<Host>], seen: &[Seen], placed: &[ChunkId], violations: &mut Vec<String>) {
    let mut at: BTreeMap<u64, (usize, Vec<u8>)> = BTreeMap::new();
    for (i, seen) in seen.iter().enumerate() {
        for (index, bytes) in seen.lock().iter() {
            match at.get(index) {
                Some((j, other)) if other != bytes => violations.push(format!(
                    "index {index}: node {} and node {} applied different commands",
                    j + 1,
                    i + 1
                )),
                Some(_) => {}
                None => drop(at.insert(*index, (i, bytes.clone()))),
            }
        }
    }
    let states: Vec<_> = hosts.iter().map(|h| h.manager_view().expect("a member").lock().state.clone()).collect();
    for (i, state) in states.iter().enumerate() {
        if std::panic::catch_unwind(|| state.check_invariants()).is_err() {
            violations.push(format!("node {}: the state's invariants fail", i + 1));
        }
        if *state != states[0] {
            violations.push(format!(
                "node {} holds {} nodes and {} chunks, node 1 {} and {} (or other figures differ)",
                i + 1,
                state.nodes().len(),
                state.chunks().len(),
                states[0].nodes().len(),
                states[0].chunks().len()
            ));
        }
        for chunk in placed {
            if state.chunk(*chunk).is_none() {
                violations.push(format!("node {}: acknowledged placement of chunk {:#x} lost", i + 1, chunk.0));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seeds() -> u64 {
        std::env::var("TUNDRA_MANAGER_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(10)
    }

    #[test]
    fn every_member_applies_the_same_commands_and_converges() {
        let (mut acknowledged, mut crashes, mut purged) = (0, 0, 0);
        for seed in 0..seeds() {
            let report = run(seed, 120, ManagerBug::None);
            assert!(
                report.violations.is_empty(),
                "seed {seed}: {:?} (replay: TUNDRA_MANAGER_SIM_SEEDS={} cargo test -p tundra-raft sim::manager)",
                report.violations,
                seed + 1
            );
            acknowledged += report.acknowledged;
            crashes += report.crashes;
            purged += usize::from(report.purged);
        }
        assert!(purged > 0, "no member's log was ever purged behind a snapshot");
        // A leader restarted never resumes its term (log/store.rs, `read_vote`): each crash of
        // a leader costs an election, so fewer commands are acknowledged per run than when it did.
        assert!(acknowledged > 10 * seeds() as usize, "{acknowledged} commands acknowledged");
        assert!(crashes > 0, "no leader crashed");
    }

    #[test]
    fn a_member_that_skips_commands_is_caught() {
        let caught = (0..seeds()).any(|seed| !run(seed, 120, ManagerBug::SkipSome).violations.is_empty());
        assert!(caught, "a member whose state diverged went unnoticed");
    }
}
