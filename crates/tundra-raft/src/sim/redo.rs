//! A volume's redo group in the simulation (seed 000 §3.2.1, §3.3): three nodes on the
//! simulated network and memory logs, a writer appending batches through whichever node leads
//! the redo group (the leader settles, checks the batch against its stream and proposes it, as
//! tundra-member's leader does), the leader crashed now and then (its log's unflushed tail lost)
//! and restarted, messages lost, duplicated and delayed. Each node's stream is a model of
//! tundra-node's replicated stream: an apply is not durable until a sync (the group's log is
//! the write-ahead log of applies), a crash loses a random part of the unsynced tail (the
//! node's group commits may have written some of it), a mark is saved only after a sync, and
//! a batch that does not follow the stream's end is refused. Checked:
//! no replica ever holds a batch that does not follow the one before it, every acknowledged
//! batch is in every replica's stream at the end, and the replicas' streams are equal. A
//! [`Scenario::move_replica`] run also moves a replica to a fourth node half way, which is
//! brought up by a copy of a voter's stream (the log purged behind every voter), and checks
//! that no voter is ever sent a copy. [`Scenario::mark_unsynced`], the twin of the sync before
//! a mark, saves marks over applies a crash may still lose.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tundra_env::Rng;

use super::check::Applied;
use super::cluster::Cluster;
use super::net::{NetFaults, SimNet};
use crate::log::LogFault;
use crate::manager_machine::MemSnapshotStore;
use crate::redo_machine::{RedoApplier, redo_group};
use crate::types::NodeId;

/// A node's redo stream: the batches `(prev, end]` it took, in order; the first `synced` are
/// durable (the node's redo log synced them), the rest are lost, in part or whole, when the
/// node crashes.
#[derive(Default)]
struct Stream {
    batches: Mutex<Vec<(u64, u64)>>,
    synced: Mutex<usize>,
    problems: Mutex<Vec<String>>,
    /// Copies of another replica's stream installed here.
    installs: Mutex<usize>,
}

impl Stream {
    fn end(&self) -> u64 {
        self.batches.lock().last().map_or(0, |b| b.1)
    }

    fn sync(&self) {
        *self.synced.lock() = self.batches.lock().len();
    }

    /// The node crashed: the synced batches survive, and of the others a prefix of `keep`
    /// at most (group commits the node's upkeep wrote before the crash).
    fn crash(&self, rng: &mut Rng) {
        let mut batches = self.batches.lock();
        let synced = *self.synced.lock();
        let unsynced = (batches.len() - synced) as u64;
        let keep = synced + rng.below(unsynced + 1) as usize;
        batches.truncate(keep);
        *self.synced.lock() = keep;
    }
}

fn encode(prev: u64, end: u64, held_by_all: u64) -> Vec<u8> {
    [prev.to_le_bytes(), end.to_le_bytes(), held_by_all.to_le_bytes()].concat()
}

struct ModelApplier {
    stream: Arc<Stream>,
    /// The injected bug of the move's twin: copies leave out the stream's last batch.
    copy_bug: bool,
    /// The injected bug of the sync's twin: marks are saved without syncing the applies.
    mark_unsynced: bool,
}

impl RedoApplier for ModelApplier {
    fn sync(&self) -> Result<(), String> {
        if !self.mark_unsynced {
            self.stream.sync();
        }
        Ok(())
    }

    fn held_by_all(&self, entry: &[u8]) -> u64 {
        entry.get(16..24).and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes)
    }

    fn apply(&self, entry: &[u8]) -> Result<Option<String>, String> {
        let (Some(prev), Some(end)) = (entry.get(..8), entry.get(8..16)) else {
            return Ok(Some("a short entry".into()));
        };
        let prev = u64::from_le_bytes(prev.try_into().expect("8 bytes"));
        let end = u64::from_le_bytes(end.try_into().expect("8 bytes"));
        let mut batches = self.stream.batches.lock();
        let at = batches.last().map_or(0, |b| b.1);
        if prev == at {
            batches.push((prev, end));
        } else if end > at {
            // Neither the batch's own (applied again) nor one it follows: a committed entry
            // the stream refuses, which the leader's check must never let through.
            self.stream.problems.lock().push(format!("entry ({prev}, {end}] committed on a stream ending at {at}"));
        }
        Ok(None)
    }

    /// The stream's batches, 16 bytes each (as the stream stands between two applies).
    fn copy(&self, out: &mut dyn FnMut(&[u8]) -> Result<(), String>) -> Result<(), String> {
        // As tundra-node's copy: the stream is synced before it is copied.
        self.stream.sync();
        let mut batches = self.stream.batches.lock().clone();
        if self.copy_bug {
            batches.pop();
        }
        for (prev, end) in batches {
            out(&[prev.to_le_bytes(), end.to_le_bytes()].concat())?;
        }
        Ok(())
    }

    /// Replaces the stream with the copy, at once (durable, as the node's redo install is).
    fn install(&self, len: u64, read: &dyn Fn(u64, usize) -> Result<Vec<u8>, String>) -> Result<(), String> {
        let len = usize::try_from(len).map_err(|_| "a copy too long".to_string())?;
        let bytes = read(0, len)?;
        if bytes.len() != len || len % 16 != 0 {
            return Err(format!("a copy of {} bytes, {len} announced", bytes.len()));
        }
        let number = |b: &[u8]| b.try_into().map(u64::from_le_bytes).map_err(|_| "a short number".to_string());
        let batches =
            bytes.chunks(16).map(|b| Ok((number(&b[..8])?, number(&b[8..])?))).collect::<Result<_, String>>()?;
        *self.stream.batches.lock() = batches;
        self.stream.sync();
        *self.stream.installs.lock() += 1;
        Ok(())
    }
}

/// How the leader proposes: as the product does, or (injected bugs) without checking the
/// batch against its stream first, or claiming every voter holds what it applied (so replicas
/// purge entries a lagging voter still needs).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Propose {
    Checked,
    Unchecked,
    ClaimsAllHold,
}

pub struct RedoReport {
    pub acknowledged: usize,
    pub crashes: usize,
    /// The highest log index any replica purged its log to.
    pub purged: u64,
    /// Whether the run moved a replica to a fourth node (its move may fail under faults).
    pub moved: bool,
    /// Copies of a stream installed on a replica (a moved one, or one left behind a purge).
    pub copies_installed: usize,
    pub violations: Vec<String>,
}

/// Entries between two marks, and entries kept below what every voter holds, in the
/// simulation: small, so that purges happen within a run.
const LOGS_PER_MARK: u64 = 4;
const KEEP_BEHIND: u64 = 2;

/// What a run does besides writing through crashes.
#[derive(Clone, Copy)]
pub struct Scenario {
    pub fault: LogFault,
    pub propose: Propose,
    /// Half way, move a replica to a fourth node, as tundra-member's redo move does: the node
    /// starts an empty replica, joins as a learner (brought up by a copy of a voter's stream,
    /// the log being purged behind every voter), becomes a voter, and the replica it replaces
    /// is dropped.
    pub move_replica: bool,
    /// The injected bug of the move's twin: every copy leaves out the stream's last batch.
    pub copy_bug: bool,
    /// The injected bug of the sync's twin: marks are saved without syncing the applies
    /// they cover first.
    pub mark_unsynced: bool,
}

pub fn run(seed: u64, steps: usize, fault: LogFault, propose: Propose) -> RedoReport {
    run_scenario(seed, steps, Scenario { fault, propose, move_replica: false, copy_bug: false, mark_unsynced: false })
}

pub fn run_scenario(seed: u64, steps: usize, scenario: Scenario) -> RedoReport {
    crate::runtime::seed_thread_rng(seed ^ 0x7ed0);
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().expect("a runtime");
    runtime.block_on(simulate(seed, steps, scenario))
}

async fn start_redo(
    cluster: &Cluster,
    i: usize,
    streams: &[Arc<Stream>],
    marks: &[Arc<MemSnapshotStore>],
    scenario: Scenario,
) {
    let host = cluster.nodes[i].host.clone().expect("the node runs");
    if scenario.propose == Propose::ClaimsAllHold {
        host.redo_held_committed();
    }
    let applier = Arc::new(ModelApplier {
        stream: streams[i].clone(),
        copy_bug: scenario.copy_bug,
        mark_unsynced: scenario.mark_unsynced,
    });
    host.add_redo_group(redo_group(1), applier, marks[i].clone(), LOGS_PER_MARK).await.expect("a redo group");
}

/// Moves a replica of `group` to node 4 (index 3): every replica node up first, then the
/// learner added and caught up, then the voters changed to drop one of the first three.
/// Answers the new voters' indexes, or `None` when the move did not finish (faults); then the
/// voters are unchanged or, if the change went through after all, read back from the group.
async fn move_to_fourth(
    cluster: &mut Cluster,
    rng: &mut Rng,
    runs: &mut BTreeSet<usize>,
    streams: &[Arc<Stream>],
    marks: &[Arc<MemSnapshotStore>],
    scenario: Scenario,
) -> bool {
    let group = redo_group(1);
    for &i in runs.iter() {
        if !cluster.is_up(i) {
            cluster.start(i).await.expect("restart");
            start_redo(cluster, i, streams, marks, scenario).await;
        }
    }
    start_redo(cluster, 3, streams, marks, scenario).await;
    let leaving = *rng.pick(&runs.iter().copied().collect::<Vec<_>>());
    for _ in 0..20 {
        let Some(leader) = cluster.leader(group) else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let added = tokio::time::timeout(Duration::from_secs(10), leader.add_learner(group, 4)).await;
        let caught_up = matches!(leader.replication_of(group, 4), Ok((Some(matched), Some(last))) if matched >= last);
        if !matches!(added, Ok(Ok(()))) || !caught_up {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        let voters: BTreeSet<NodeId> =
            runs.iter().filter(|&&i| i != leaving).map(|&i| i as u64 + 1).chain([4]).collect();
        if let Ok(Ok(())) = tokio::time::timeout(Duration::from_secs(10), leader.change_voters(group, voters)).await {
            if let Some(host) = cluster.nodes[leaving].host.clone() {
                host.drop_redo_group(group).await.expect("drop the moved replica");
            }
            runs.remove(&leaving);
            runs.insert(3);
            return true;
        }
    }
    false
}

async fn simulate(seed: u64, steps: usize, scenario: Scenario) -> RedoReport {
    let propose = scenario.propose;
    let mut rng = Rng::new(seed);
    // What each crash loses of a stream's unsynced tail, apart from `rng` (which the runs'
    // other choices follow).
    let mut losses = Rng::new(seed ^ 0x5eed_10a5);
    let faults = NetFaults { loss: 0.05, duplicate: 0.05, delay_max_ms: 20 };
    let net = SimNet::new(rng.fork(), faults, false);
    let applied = Arc::new(Mutex::new(Applied::default()));
    // A move takes a fourth node (and no chunk group: only the redo group runs).
    let (nodes, chunks) = if scenario.move_replica { (4, 0) } else { (3, 1) };
    let mut cluster = Cluster::build(&mut rng, net, nodes, chunks, scenario.fault, applied, false).await;
    let streams: Vec<Arc<Stream>> = (0..nodes).map(|_| Arc::default()).collect();
    // Each node's saved marks survive its crashes, as its disk does.
    let marks: Vec<Arc<MemSnapshotStore>> = (0..nodes).map(|_| Arc::default()).collect();
    // The nodes that run a replica of the group.
    let mut runs: BTreeSet<usize> = (0..3).collect();
    for &i in &runs {
        start_redo(&cluster, i, &streams, &marks, scenario).await;
    }
    let group = redo_group(1);
    let voters: BTreeSet<NodeId> = (1..=3).collect();
    cluster.nodes[0].host.clone().expect("up").initialize(group, voters).await.expect("initialize");
    let mut report = RedoReport {
        acknowledged: 0,
        crashes: 0,
        purged: 0,
        moved: false,
        copies_installed: 0,
        violations: Vec::new(),
    };
    let mut acknowledged: Vec<(u64, u64)> = Vec::new();
    let mut next_lsn = 1u64;
    for step in 0..steps {
        if scenario.move_replica && step == steps / 2 {
            report.moved = move_to_fourth(&mut cluster, &mut rng, &mut runs, &streams, &marks, scenario).await;
            cluster.net.note(|| format!("moved a redo replica: {} (replicas on {runs:?})", report.moved));
        }
        if let Some(down) = runs.iter().copied().find(|&i| !cluster.is_up(i)) {
            if rng.chance(0.3) {
                cluster.start(down).await.expect("restart");
                start_redo(&cluster, down, &streams, &marks, scenario).await;
            }
        } else if rng.chance(0.05)
            && let Some(leader) = cluster.leader(group)
        {
            let i = (leader.id() - 1) as usize;
            cluster.crash(i, &mut rng).await;
            streams[i].crash(&mut losses);
            report.crashes += 1;
        }
        if let Some(leader) = cluster.leader(group) {
            let i = (leader.id() - 1) as usize;
            let end = next_lsn + rng.below(3);
            let settled = leader.settle(group, Duration::from_secs(2)).await;
            let prev = streams[i].end();
            let ok = match propose {
                Propose::Checked => settled.is_ok(),
                Propose::Unchecked => true,
                Propose::ClaimsAllHold => settled.is_ok(),
            };
            if ok {
                // The writer's view: its batch follows the last one it had acknowledged.
                let writer_prev = acknowledged.last().map_or(0, |b| b.1);
                let prev = if propose == Propose::Unchecked { writer_prev } else { prev };
                if propose == Propose::Unchecked || prev == writer_prev {
                    // Now and then the leader dies while its entry is on the way: the writer
                    // never hears, and the entry may or may not commit.
                    let all_up = runs.iter().all(|&j| cluster.is_up(j));
                    let crash_in = (rng.chance(0.15) && all_up).then(|| rng.range(1..15));
                    let limit = Duration::from_millis(crash_in.unwrap_or(5_000));
                    let proposal = tokio::time::timeout(
                        limit,
                        leader.propose_bytes(group, encode(prev, end, leader.redo_held_by_all(group))),
                    )
                    .await;
                    match proposal {
                        Ok(Ok(())) => {
                            acknowledged.push((prev, end));
                            next_lsn = end + 1;
                            report.acknowledged += 1;
                        }
                        Err(_) if crash_in.is_some() => {
                            drop(leader);
                            cluster.crash(i, &mut rng).await;
                            streams[i].crash(&mut losses);
                            report.crashes += 1;
                        }
                        _ => {}
                    }
                } else {
                    // A batch whose answer was lost is there: the writer moves on from it.
                    acknowledged.push((writer_prev, prev));
                    next_lsn = prev + 1;
                }
            }
        }
        for node in &cluster.nodes {
            if let Some(host) = node.host.clone() {
                host.purge_redo_logs(KEEP_BEHIND).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.range(1..40))).await;
    }
    // Everyone up, no faults: every replica catches up.
    for &i in &runs {
        if !cluster.is_up(i) {
            cluster.start(i).await.expect("restart");
            start_redo(&cluster, i, &streams, &marks, scenario).await;
        }
    }
    cluster.net.set_faults(NetFaults { loss: 0.0, duplicate: 0.0, delay_max_ms: 0 });
    let target = loop {
        if let Some(leader) = cluster.leader(group)
            && leader.settle(group, Duration::from_secs(5)).await.is_ok()
        {
            break streams[(leader.id() - 1) as usize].end();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for _ in 0..600 {
        if runs.iter().all(|&i| streams[i].end() == target) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for node in &cluster.nodes {
        if let Some(host) = node.host.clone()
            && let Ok(raft) = host.raft(group)
        {
            report.purged = report.purged.max(raft.metrics().borrow().purged.map_or(0, |id| id.index));
        }
    }
    report.copies_installed = streams.iter().map(|s| *s.installs.lock()).sum();
    let first_node = *runs.iter().next().expect("a replica");
    let first = streams[first_node].batches.lock().clone();
    for (i, stream) in streams.iter().enumerate() {
        report.violations.extend(stream.problems.lock().iter().map(|p| format!("node {}: {p}", i + 1)));
        // The log is purged only below what every voter holds, so only a new replica (node 4,
        // a learner) is ever sent a copy: a voter that needed one lost its log's entries.
        let installs = *stream.installs.lock();
        if i < 3 && installs > 0 {
            report.violations.push(format!(
                "node {}: a voter was sent {installs} copy(ies) of the stream: the log was purged past what it held",
                i + 1
            ));
        }
        if !runs.contains(&i) {
            continue;
        }
        let batches = stream.batches.lock().clone();
        if batches != first {
            report.violations.push(format!("node {} holds {batches:?}, node {} {first:?}", i + 1, first_node + 1));
        }
        for ack in &acknowledged {
            if !batches.contains(ack) {
                report.violations.push(format!("node {}: acknowledged batch {ack:?} lost", i + 1));
            }
        }
    }
    cluster.shutdown().await;
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seeds() -> u64 {
        std::env::var("TUNDRA_REDO_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(20)
    }

    #[test]
    fn acknowledged_redo_batches_survive_leader_crashes() {
        let (mut acknowledged, mut crashes, mut purging) = (0, 0, 0);
        for seed in 0..seeds() {
            let report = run(seed, 120, LogFault::None, Propose::Checked);
            assert!(
                report.violations.is_empty(),
                "seed {seed}: {:?} (replay: TUNDRA_REDO_SIM_SEEDS={} cargo test -p tundra-raft sim::redo)",
                report.violations,
                seed + 1
            );
            acknowledged += report.acknowledged;
            crashes += report.crashes;
            purging += usize::from(report.purged > 0);
        }
        println!("{acknowledged} batches acknowledged, {crashes} crashes, {purging} runs purged a log");
        // A leader restarted never resumes its term (log/store.rs, `read_vote`): each crash of
        // a leader costs an election, so fewer batches are acknowledged per run than when it did.
        assert!(acknowledged > 10 * seeds() as usize, "{acknowledged} batches acknowledged");
        assert!(crashes > 0, "no leader crashed");
        // The logs were purged behind what every voter held, through the crashes.
        assert!(purging > seeds() as usize / 2, "only {purging} runs purged a log");
    }

    #[test]
    fn a_leader_that_claims_every_voter_holds_its_log_is_caught() {
        // Seed 33 is the first that shows it since replicas ask a pre-vote (campaign.rs).
        let caught = (0..seeds().max(40)).find_map(|seed| {
            let report = run(seed, 120, LogFault::None, Propose::ClaimsAllHold);
            report.violations.first().map(|v| format!("seed {seed}: {v}"))
        });
        println!("caught: {caught:?}");
        assert!(caught.is_some(), "a purge past a lagging voter's log went unnoticed");
    }

    #[test]
    fn a_log_whose_flush_lies_loses_acknowledged_redo_and_is_caught() {
        let caught =
            (0..seeds()).any(|seed| !run(seed, 120, LogFault::FlushLies, Propose::Checked).violations.is_empty());
        assert!(caught, "a log that loses acknowledged entries went unnoticed");
    }

    fn moving(copy_bug: bool) -> Scenario {
        Scenario {
            fault: LogFault::None,
            propose: Propose::Checked,
            move_replica: true,
            copy_bug,
            mark_unsynced: false,
        }
    }

    /// A replica moved to a fourth node half way (the log purged behind every voter, so the
    /// new replica is brought up by a copy of a voter's stream), through the same crashes and
    /// faults: no violation, and the moves and copies happened.
    #[test]
    fn a_redo_replica_moved_by_a_copy_of_the_stream_loses_nothing() {
        let (mut moved, mut copies, mut acknowledged) = (0, 0, 0);
        for seed in 0..seeds() {
            let report = run_scenario(seed, 120, moving(false));
            assert!(
                report.violations.is_empty(),
                "seed {seed}: {:?} (replay: TUNDRA_REDO_SIM_SEEDS={} cargo test -p tundra-raft sim::redo)",
                report.violations,
                seed + 1
            );
            moved += usize::from(report.moved);
            copies += report.copies_installed;
            acknowledged += report.acknowledged;
        }
        println!("{moved} moves, {copies} copies installed, {acknowledged} batches acknowledged");
        assert!(moved > seeds() as usize / 2, "only {moved} runs moved a replica");
        assert!(copies >= moved, "{copies} copies installed for {moved} moves: the moves did not take copies");
    }

    /// The twin of a restarted leader's new term (log/store.rs, `read_vote`): a leader that
    /// resumes its term after a crash may have lost entries its followers hold (sent before
    /// its own log's sync) and proposes other entries under their log ids; the followers keep
    /// theirs, and some seed's checks find streams that differ or a batch lost.
    #[test]
    fn a_leader_that_resumes_its_term_after_a_restart_is_caught() {
        let resume = Scenario { fault: LogFault::ResumeTerm, ..moving(false) };
        let caught = (0..seeds()).find_map(|seed| {
            let report = run_scenario(seed, 120, resume);
            report.violations.first().map(|v| format!("seed {seed}: {v}"))
        });
        println!("caught: {caught:?}");
        assert!(caught.is_some(), "a leader that resumed its term after a restart went unnoticed");
    }

    /// The twin: copies that leave out the stream's last batch leave the moved replica with a
    /// hole, which some seed's checks find.
    #[test]
    fn a_copy_without_its_last_batch_is_caught() {
        let caught = (0..seeds()).find_map(|seed| {
            let report = run_scenario(seed, 120, moving(true));
            report.violations.first().map(|v| format!("seed {seed}: {v}"))
        });
        println!("caught: {caught:?}");
        assert!(caught.is_some(), "a moved replica with a hole in its stream went unnoticed");
    }

    /// The twin of the sync before a mark: marks saved over applies that are not durable yet
    /// let a crash lose batches openraft never applies again (they are behind the mark), which
    /// some seed's checks find as acknowledged batches lost or replicas that differ.
    #[test]
    fn a_mark_saved_without_syncing_the_applies_first_is_caught() {
        let unsynced = Scenario {
            fault: LogFault::None,
            propose: Propose::Checked,
            move_replica: false,
            copy_bug: false,
            mark_unsynced: true,
        };
        let caught = (0..seeds()).find_map(|seed| {
            let report = run_scenario(seed, 120, unsynced);
            report.violations.first().map(|v| format!("seed {seed}: {v}"))
        });
        println!("caught: {caught:?}");
        assert!(caught.is_some(), "batches lost behind an unsynced mark went unnoticed");
    }

    #[test]
    fn a_leader_that_proposes_unchecked_batches_is_caught() {
        let caught = (0..seeds()).any(|seed| !run(seed, 120, LogFault::None, Propose::Unchecked).violations.is_empty());
        assert!(caught, "committed batches the streams refuse went unnoticed");
    }
}
