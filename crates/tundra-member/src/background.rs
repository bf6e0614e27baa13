//! The cluster manager's background rebalancer (seed 000 §4.2: the manager, which knows every
//! chunk's logical and physical bytes from the nodes' reports, migrates chunks on its own while
//! writers keep writing). With `[cluster] rebalance_every`, a thread on every node wakes once a
//! period; on the node that leads the manager's group it runs one round:
//!
//! 1. no round while a drain is under way (a draining node in the manager's state still holds
//!    chunks), nor while another mover holds the claim on moves (manager.rs's `Claim`: a
//!    `tundra cluster rebalance` run, a drain, a single move, each of which takes it too);
//! 2. the round takes the claim, then makes at most [`MOVES_PER_ROUND`] moves, each one
//!    rebalance.rs's `rebalance_step` under `rebalance_policy` (planned from the manager's
//!    replicated chunk sizes, carried out by migrate.rs's `execute`, paced by
//!    `move_bytes_per_sec`), exactly as the command line's steps are;
//! 3. it gives the claim back and records what it did in the manager's replicated state
//!    (`RecordRound`), which `tundra cluster status --json` shows
//!    (`manager.background_rebalance.last_round`), whichever node leads the manager then. A
//!    round skipped because another mover holds the claim is not written (it would add an
//!    entry every period while a drain runs), nor an idle round (no plan) when the last one
//!    written was idle too and is younger than [`IDLE_RECORD_EVERY`].
//!
//! The counters beside the record (`rounds`, `moves_total`, `failures_total`) are this node's
//! since it started.
//!
//! Rounds run one after the other on one thread, so two never overlap. At shutdown the thread
//! stops before its next move (a move under way finishes or is rolled back first, as any move
//! is), and the node waits for it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tundra_cluster::NodeStatus;
use tundra_raft::manager_machine::manager_group;

use crate::cluster::ClusterNode;
use crate::manager::{ManagerCall, ManagerReply, MoveOwner};
use crate::rebalance::SkippedMove;

/// The most moves one round makes: a round ends, and the next plans afresh from the sizes the
/// nodes reported meanwhile, rather than carry out a long plan made from old figures.
pub const MOVES_PER_ROUND: usize = 4;
/// How often the sleeping thread looks for shutdown.
const STOP_CHECK: Duration = Duration::from_millis(100);
/// How long shutdown waits for a round's move under way (a catch-up's limit and its pacing).
const STOP_WAIT: Duration = Duration::from_secs(45);
/// How many moves refused for good the background rounds remember (the oldest forgotten first).
const LASTING_SKIPS_MAX: usize = 4096;
/// How often an idle cluster's round is written to the manager's log.
const IDLE_RECORD_EVERY: Duration = Duration::from_secs(60);

pub use tundra_cluster::RoundRecord;

/// The background rebalancer as status shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BackgroundStatus {
    /// `rebalance_every` in milliseconds; null when background rounds are off.
    pub every_ms: Option<u64>,
    /// `rebalance_policy`; null when off.
    pub policy: Option<String>,
    /// A round is under way.
    pub running: bool,
    /// Rounds this node ran since it started (as the manager's leader), skipped ones included.
    pub rounds: u64,
    pub moves_total: u64,
    pub failures_total: u64,
    pub last_round: Option<RoundRecord>,
}

/// Starts the background rebalancer's thread if `rebalance_every` asks for one.
pub(crate) fn start(node: &Arc<ClusterNode>) {
    let Some(every) = node.rebalance.every else { return };
    {
        let mut status = node.background.lock();
        status.every_ms = Some(every.as_millis() as u64);
        status.policy = Some(node.rebalance.policy.name().to_string());
    }
    let weak = Arc::downgrade(node);
    let spawned = std::thread::Builder::new().name("tundra-rebalance".into()).spawn(move || {
        while sleep_unless_stopped(&weak, every) {
            let Some(node) = weak.upgrade() else { return };
            if node.local_leader(manager_group()) == Some(node.me) {
                node.background_round();
            }
        }
    });
    // Without the thread the node still serves; status says no round ever ran.
    if let Ok(handle) = spawned {
        *node.rebalancer.lock() = Some(handle);
    }
}

/// Sleeps `period`, looking for shutdown; false once the node stops or is gone.
fn sleep_unless_stopped(weak: &std::sync::Weak<ClusterNode>, period: Duration) -> bool {
    let until = Instant::now() + period;
    loop {
        match weak.upgrade() {
            Some(node) if !node.stopping.load(Ordering::Relaxed) => {}
            _ => return false,
        }
        let now = Instant::now();
        if now >= until {
            return true;
        }
        std::thread::sleep(STOP_CHECK.min(until - now));
    }
}

/// Stops the thread: no new move starts, and the one under way (if any) ends first, for up
/// to [`STOP_WAIT`].
pub(crate) fn stop(node: &ClusterNode) {
    node.stopping.store(true, Ordering::Relaxed);
    let Some(handle) = node.rebalancer.lock().take() else { return };
    if handle.thread().id() == std::thread::current().id() {
        return;
    }
    let deadline = Instant::now() + STOP_WAIT;
    while !handle.is_finished() && Instant::now() < deadline {
        std::thread::sleep(STOP_CHECK);
    }
    if handle.is_finished() {
        let _ = handle.join();
    }
}

impl ClusterNode {
    /// One background round, recorded.
    fn background_round(&self) {
        let started = Instant::now();
        let started_unix_ms =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        self.background.lock().running = true;
        let mut record = RoundRecord { node: self.me, started_unix_ms, ..Default::default() };
        match self.round_blocker() {
            Some(why) => record.skipped = Some(why),
            None => self.round_moves(&mut record),
        }
        record.seconds = started.elapsed().as_secs_f64();
        if self.worth_recording(&record) {
            // A lost write leaves the previous record; the counters below still count the round.
            let _ = self.block_on(self.to_manager(ManagerCall::RecordRound(record.clone())));
        }
        let mut status = self.background.lock();
        status.running = false;
        status.rounds += 1;
        status.moves_total += record.moves;
        status.failures_total += record.failures;
        status.last_round = Some(record);
    }

    /// Whether `record` goes to the manager's state: not a skipped round, and not an idle one
    /// when the last one written was idle and recent.
    fn worth_recording(&self, record: &RoundRecord) -> bool {
        if record.skipped.is_some() {
            return false;
        }
        if !record.idle() {
            return true;
        }
        let Some(view) = self.host.manager_view() else { return true };
        let last = view.lock().state.last_round().cloned();
        match last {
            Some(last) if last.idle() => {
                record.started_unix_ms.saturating_sub(last.started_unix_ms) >= IDLE_RECORD_EVERY.as_millis() as u64
            }
            _ => true,
        }
    }

    /// Why no round may start now, if something forbids it; else the claim on moves is ours.
    fn round_blocker(&self) -> Option<String> {
        let view = self.host.manager_view()?;
        let draining = view
            .lock()
            .state
            .nodes()
            .iter()
            .find(|(_, n)| n.status == NodeStatus::Draining && !n.chunks.is_empty())
            .map(|(id, _)| id.0);
        if let Some(node) = draining {
            return Some(format!("node {node} is being drained"));
        }
        let owner = MoveOwner::Background { node: self.me };
        match self.block_on(self.to_manager(ManagerCall::Claim { owner })) {
            Ok(ManagerReply::Claimed) => None,
            Ok(ManagerReply::Busy(why)) => Some(why),
            Ok(other) => Some(format!("the claim on moves answered {other:?}")),
            Err(why) => Some(format!("the manager did not give the claim on moves: {why:?}")),
        }
    }

    /// The round's moves, holding the claim; gives it back after.
    fn round_moves(&self, record: &mut RoundRecord) {
        let owner = MoveOwner::Background { node: self.me };
        // Moves refused for good in earlier rounds stay out of the plans (the plans go around
        // them rather than stall on them round after round).
        let mut skip: Vec<SkippedMove> = self.lasting_skips.lock().clone();
        for step in 0..MOVES_PER_ROUND {
            if self.stopping.load(Ordering::Relaxed) {
                break;
            }
            let progress = match self.rebalance_step(self.rebalance.policy.name(), false, &skip, owner) {
                Ok(progress) => progress,
                Err(why) => {
                    record.error = Some(format!("{why:?}"));
                    break;
                }
            };
            if step == 0 {
                record.planned = progress.plan.len();
            }
            if let Some(moved) = &progress.moved {
                record.moves += 1;
                // Not sent back to the node it left in this round (as a `tundra cluster
                // rebalance` run does).
                skip.push(SkippedMove { volume_id: moved.volume_id, chunk: moved.chunk, to: moved.from });
            }
            if let Some((planned, why)) = &progress.failed {
                record.failures += 1;
                record.failed.push(format!(
                    "chunk {} of {} from node {} to node {}: {why}",
                    planned.chunk, planned.volume, planned.from, planned.to
                ));
                let skipped = SkippedMove { volume_id: planned.volume_id, chunk: planned.chunk, to: planned.to };
                skip.push(skipped);
                if progress.failed_for_good {
                    let mut lasting = self.lasting_skips.lock();
                    if lasting.len() >= LASTING_SKIPS_MAX {
                        lasting.remove(0);
                    }
                    lasting.push(skipped);
                }
            }
            if progress.moved.is_none() && progress.failed.is_none() {
                break;
            }
        }
        self.block_on(self.release_moves(owner));
    }
}
