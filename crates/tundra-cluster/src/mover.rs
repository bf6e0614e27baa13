//! What the manager's replicated state keeps about the movers and the nodes' reports beyond
//! the figures the decisions count: who holds the claim on moves ([`MoveClaim`]: one mover at
//! a time across the cluster, with a lease so that a dead holder's claim lapses), what the
//! background rebalancer's last round did ([`RoundRecord`]), and when a node last reported
//! ([`REPORT_STALE_AFTER_MS`]: a node silent for longer is unknown to the decisions).
//!
//! Every time here is a wall-clock reading in milliseconds since the Unix epoch that the
//! manager's leader put in a command (`Report`, `PlaceChunkAt`, `Claim`); `apply` never reads a
//! clock, so every member decides alike from the same log. A time is only ever compared with
//! another time a leader wrote, so the rule assumes the members' clocks agree to well within
//! the bounds (seconds), as NTP keeps them.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::usage::NodeId;

/// How long after its last report a node counts as unknown to placement and moves: five report
/// periods of one second (a node reports every period; the leader writes a report to the log
/// at least every [`REPORT_REFRESH_MS`], so a live node's report is never older than about two
/// periods plus a commit, and five leave room for a slow commit or one lost report).
pub const REPORT_STALE_AFTER_MS: u64 = 5_000;

/// How often the manager's leader writes a live node's unchanged report to the log again, so
/// that its time stays fresh.
pub const REPORT_REFRESH_MS: u64 = 2_000;

/// The longest lease a claim may take (a day): a bound on a figure from the log.
pub const CLAIM_LEASE_MAX_MS: u64 = 24 * 3_600_000;

/// The most failed moves, and the longest text, a round record carries.
pub const ROUND_FAILURES_MAX: usize = 64;
pub const ROUND_TEXT_MAX_BYTES: usize = 4096;

/// Who makes moves: the holder of the claim on moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MoveOwner {
    /// The manager leader's background rebalancer on `node`.
    Background { node: u64 },
    /// A `tundra cluster rebalance` run: a number the command line drew, and the node it asks.
    Rebalance { node: u64, run: u64 },
    /// A drain of `node` (`tundra cluster drain`).
    Drain { node: u64 },
    /// `tundra cluster move`, coordinated by `node`.
    Move { node: u64 },
    /// The manager leader's repair of dead node `node` (its replicas moved off it after
    /// `repair_after`); added in command version 5 and snapshot version 4.
    Repair { node: u64 },
}

impl std::fmt::Display for MoveOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MoveOwner::Background { node } => write!(f, "the background rebalancer on node {node}"),
            MoveOwner::Rebalance { node, run } => {
                write!(f, "a `tundra cluster rebalance` run ({run:x}) through node {node}")
            }
            MoveOwner::Drain { node } => write!(f, "a drain of node {node}"),
            MoveOwner::Move { node } => write!(f, "a `tundra cluster move` through node {node}"),
            MoveOwner::Repair { node } => write!(f, "the repair of dead node {node}"),
        }
    }
}

/// The claim on moves as the replicated state holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveClaim {
    pub owner: MoveOwner,
    /// When the owner took it (renewals keep this).
    pub taken_unix_ms: u64,
    /// When it lapses unless renewed.
    pub until_unix_ms: u64,
}

impl MoveClaim {
    /// Whether the claim still holds at `now_unix_ms`.
    pub fn holds_at(&self, now_unix_ms: u64) -> bool {
        self.until_unix_ms > now_unix_ms
    }
}

/// What one round of the background rebalancer did (background.rs in tundra-member).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RoundRecord {
    /// The node whose background rebalancer ran it (the manager's leader then).
    pub node: u64,
    /// When it started, in milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
    pub seconds: f64,
    /// Moves the round's first plan held.
    pub planned: usize,
    pub moves: u64,
    pub failures: u64,
    /// Each failed move (rolled back), and why.
    pub failed: Vec<String>,
    /// Why the round made no move at all without trying (another mover, a drain under way).
    pub skipped: Option<String>,
    /// Why the round ended early (the manager did not answer, a node did not).
    pub error: Option<String>,
}

impl RoundRecord {
    /// Whether the round neither planned, moved nor failed: an idle cluster's round.
    pub fn idle(&self) -> bool {
        self.planned == 0 && self.moves == 0 && self.failures == 0 && self.error.is_none() && self.skipped.is_none()
    }

    /// Refuses a record whose texts or counts pass the bounds, or whose seconds are not a
    /// finite, non-negative number.
    pub fn check(&self) -> Result<()> {
        if self.failed.len() > ROUND_FAILURES_MAX {
            return Err(Error::invalid(format!(
                "a round record with {} failures, past {ROUND_FAILURES_MAX}",
                self.failed.len()
            )));
        }
        let texts = self.failed.iter().chain(self.skipped.iter()).chain(self.error.iter());
        if let Some(long) = texts.into_iter().find(|t| t.len() > ROUND_TEXT_MAX_BYTES) {
            return Err(Error::invalid(format!(
                "a round record's text of {} bytes, past {ROUND_TEXT_MAX_BYTES}",
                long.len()
            )));
        }
        if !self.seconds.is_finite() || self.seconds < 0.0 {
            return Err(Error::invalid(format!("a round record of {} seconds", self.seconds)));
        }
        Ok(())
    }

    /// The record cut to the bounds [`RoundRecord::check`] sets (for the leader that writes it).
    pub fn bounded(mut self) -> RoundRecord {
        let cut = |text: &mut String| {
            if text.len() > ROUND_TEXT_MAX_BYTES {
                let mut end = ROUND_TEXT_MAX_BYTES;
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                text.truncate(end);
            }
        };
        self.failed.truncate(ROUND_FAILURES_MAX);
        self.failed.iter_mut().for_each(cut);
        self.skipped.iter_mut().for_each(cut);
        self.error.iter_mut().for_each(cut);
        if !self.seconds.is_finite() || self.seconds < 0.0 {
            self.seconds = 0.0;
        }
        self
    }
}

/// Whether a node whose last report was written at `reported_unix_ms` (none: never, or only
/// before reports carried a time) is unknown at `now_unix_ms`.
pub fn report_stale(reported_unix_ms: Option<u64>, now_unix_ms: u64) -> bool {
    match reported_unix_ms {
        None => true,
        Some(at) => now_unix_ms.saturating_sub(at) > REPORT_STALE_AFTER_MS,
    }
}

/// The nodes of `nodes` whose reports are stale at `now_unix_ms`.
pub fn stale_nodes<'a>(
    nodes: impl IntoIterator<Item = (&'a NodeId, &'a crate::state::NodeState)>,
    now_unix_ms: u64,
) -> Vec<NodeId> {
    nodes.into_iter().filter(|(_, n)| report_stale(n.reported_unix_ms, now_unix_ms)).map(|(id, _)| *id).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ManagerConfig, Policy};
    use crate::state::{ClusterState, Command};
    use crate::usage::Space;
    use tundra_store::ids::ChunkId;

    const GIB: u64 = 1 << 30;
    const NOW: u64 = 1_700_000_000_000;

    /// Four empty nodes; nodes 1 to 3 reported at `NOW`, node 4 (the emptiest: it would be
    /// chosen first) `node_4_age_ms` earlier.
    fn cluster(node_4_age_ms: u64) -> ClusterState {
        let mut state = ClusterState::new(ManagerConfig::paper(Policy::Logical)).unwrap();
        let capacity = Space::new(100 * GIB, 40 * GIB);
        for node in 1..=4 {
            state.apply(&Command::AddNode { node: NodeId(node), capacity }).unwrap();
            let used = Space::new(if node == 4 { 0 } else { GIB }, 0);
            let at_unix_ms = if node == 4 { NOW - node_4_age_ms } else { NOW };
            let report = Command::Report { node: NodeId(node), capacity, used, overcommit: false, at_unix_ms };
            state.apply(&report).unwrap();
        }
        state
    }

    #[test]
    fn a_report_is_stale_past_the_bound_and_missing_is_stale() {
        assert!(!report_stale(Some(NOW), NOW));
        assert!(!report_stale(Some(NOW - REPORT_STALE_AFTER_MS), NOW));
        assert!(report_stale(Some(NOW - REPORT_STALE_AFTER_MS - 1), NOW));
        assert!(report_stale(None, NOW));
        // A time ahead of the judge's clock (another leader's clock a little ahead) is fresh.
        assert!(!report_stale(Some(NOW + 500), NOW));
    }

    /// A stale node takes no replica of a placement at a time, and is no move's target; a
    /// fresh one does (the twin: the same cluster with node 4's report fresh).
    #[test]
    fn a_stale_node_takes_no_replica_and_no_move() {
        let stale_age = REPORT_STALE_AFTER_MS + 1;
        for (age, stale) in [(stale_age, true), (REPORT_STALE_AFTER_MS / 2, false)] {
            let mut state = cluster(age);
            let place = Command::PlaceChunkAt { chunk: ChunkId(1 << 32), expected_logical_bytes: GIB, at_unix_ms: NOW };
            let Ok(crate::state::Applied::Placed(chosen)) = state.apply(&place) else { panic!("placed") };
            assert_eq!(chosen.contains(&NodeId(4)), !stale, "age {age}: {chosen:?}");
            // Planning from a copy marked at NOW: node 4 is empty, so the logical rule would
            // fill it, unless it is unknown.
            let mut decision = state.clone();
            let marked = decision.mark_unknown(NOW);
            assert_eq!(marked.contains(&NodeId(4)), stale);
            let onto_4 = decision.plan().moves.iter().any(|m| m.to == NodeId(4));
            if stale {
                assert!(!onto_4, "a move onto an unknown node");
                let moving = crate::plan::Move {
                    chunk: ChunkId(1 << 32),
                    from: chosen[0],
                    to: NodeId(4),
                    reason: crate::plan::MoveReason::LogicalUnder,
                };
                assert!(decision.apply(&Command::BeginMove(moving)).is_err());
            }
        }
        // With three fresh nodes and one stale, three replicas still fit; with two stale, the
        // error names the unknown nodes.
        let mut state = cluster(REPORT_STALE_AFTER_MS + 1);
        let capacity = Space::new(100 * GIB, 40 * GIB);
        let old = Command::Report { node: NodeId(3), capacity, used: Space::ZERO, overcommit: false, at_unix_ms: 0 };
        state.apply(&old).unwrap();
        let place = Command::PlaceChunkAt { chunk: ChunkId(2 << 32), expected_logical_bytes: GIB, at_unix_ms: NOW };
        let error = state.apply(&place).unwrap_err();
        assert!(error.message().contains("unknown") && error.message().contains("node 3, 4"), "{error}");
    }

    #[test]
    fn one_claim_at_a_time_until_released_or_lapsed() {
        let mut state = ClusterState::new(ManagerConfig::paper(Policy::Logical)).unwrap();
        let a = MoveOwner::Drain { node: 4 };
        let b = MoveOwner::Background { node: 1 };
        state.apply(&Command::Claim { owner: a, at_unix_ms: NOW, lease_ms: 10_000 }).unwrap();
        let error = state.apply(&Command::Claim { owner: b, at_unix_ms: NOW + 1_000, lease_ms: 10_000 }).unwrap_err();
        assert!(error.message().contains("a drain of node 4 is making moves"), "{error}");
        // A release by another owner changes nothing; the holder renews, keeping when it took it.
        state.apply(&Command::Release { owner: b }).unwrap();
        state.apply(&Command::Claim { owner: a, at_unix_ms: NOW + 5_000, lease_ms: 10_000 }).unwrap();
        let claim = *state.claim().unwrap();
        assert_eq!((claim.owner, claim.taken_unix_ms, claim.until_unix_ms), (a, NOW, NOW + 15_000));
        assert!(state.apply(&Command::Claim { owner: b, at_unix_ms: NOW + 14_999, lease_ms: 1 }).is_err());
        // Lapsed: another owner takes it.
        state.apply(&Command::Claim { owner: b, at_unix_ms: NOW + 15_000, lease_ms: 10_000 }).unwrap();
        assert_eq!(state.claim().unwrap().owner, b);
        // Released: anyone takes it at once.
        state.apply(&Command::Release { owner: b }).unwrap();
        assert!(state.claim().is_none());
        state.apply(&Command::Claim { owner: a, at_unix_ms: NOW + 15_001, lease_ms: 10_000 }).unwrap();
    }
}
