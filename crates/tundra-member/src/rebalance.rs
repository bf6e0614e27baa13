//! `tundra cluster rebalance`: tundra-cluster's plans (seed 000 §4.2.1 logical rule, §4.2.2
//! zones A–D and the band [c_l, c_h]) carried out on a running cluster, one move at a time.
//!
//! Every decision reads one [`ClusterState`], the cluster manager's replicated state as its
//! leader holds it, fetched by [`ClusterNode::decision_state`]: every node's drive capacity
//! and usage and every chunk's replicas and size, all from the nodes' reports (a chunk not yet
//! reported counts at its expected size, a node silent for over `REPORT_STALE_AFTER_MS` is
//! unknown, and the answer says both). That function is the only source of decisions, and it
//! asks no node anything. The manager leader's
//! background rounds (background.rs) take the same steps. A step settles moves left half done,
//! plans, and carries out the plan's first move with migrate.rs's `execute` (rolled back on
//! failure); the command line repeats steps, so every
//! move is planned from the cluster as the previous ones left it. A dry run also simulates the
//! whole sequence on the decision state (each plan's first move begun and finished, then
//! planned again), which is what the steps would do if no size changed meanwhile: the
//! prediction a real run is compared against.

use serde::{Deserialize, Serialize};
use tundra_cluster::{Band, ChunkId, ClusterState, Command, ManagerConfig, Move, NodeId, Policy, Space, Zone};
use tundra_node::ClusterConfig;
use tundra_store::ids::VolumeId;

use crate::cluster::ClusterNode;
use crate::manager::MoveOwner;
use crate::messages::Refusal;

/// How many moves a dry run simulates at most.
const SIMULATED_MOVES_MAX: usize = 10_000;

/// The `[cluster]` keys that shape rebalancing, checked when the node starts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RebalanceSettings {
    pub band_below: f64,
    pub band_above: f64,
    pub logical_margin: f64,
    /// 0: unlimited.
    pub move_bytes_per_sec: u64,
    /// `rebalance_every`: the period of the manager leader's background rounds (background.rs);
    /// `None`: no background rounds.
    pub every: Option<std::time::Duration>,
    /// `rebalance_policy`: the background rounds' policy.
    pub policy: Policy,
}

impl RebalanceSettings {
    /// From `[cluster]`, with the defaults; refuses numbers the decisions cannot work with.
    pub fn from_config(config: &ClusterConfig) -> Result<RebalanceSettings, String> {
        let settings = RebalanceSettings {
            band_below: config.rebalance_band_below.unwrap_or(0.10),
            band_above: config.rebalance_band_above.unwrap_or(0.10),
            logical_margin: config.rebalance_logical_margin.unwrap_or(ManagerConfig::PAPER_LOGICAL_MARGIN),
            move_bytes_per_sec: config.move_bytes_per_sec.unwrap_or(tundra_node::config::DEFAULT_MOVE_BYTES_PER_SEC),
            every: match config.rebalance_every.as_deref() {
                None => None,
                Some(text) => {
                    parse_period(text).map_err(|why| format!("[cluster] rebalance_every = {text:?}: {why}"))?
                }
            },
            policy: match config.rebalance_policy.as_deref() {
                None => Policy::CompressionAware,
                Some(name) => {
                    Policy::parse(name).map_err(|e| format!("[cluster] rebalance_policy: {}", e.message()))?
                }
            },
        };
        settings.manager_config(Policy::CompressionAware).validate().map_err(|e| {
            format!("[cluster] rebalance_band_below/above or rebalance_logical_margin: {}", e.message())
        })?;
        Ok(settings)
    }

    /// The decision core's configuration under `policy`: the paper's, with this band and margin.
    pub fn manager_config(&self, policy: Policy) -> ManagerConfig {
        let mut config = ManagerConfig::paper(policy);
        config.band = Band::Relative { below: self.band_below, above: self.band_above };
        config.logical_margin = self.logical_margin;
        config
    }
}

impl Default for RebalanceSettings {
    fn default() -> RebalanceSettings {
        RebalanceSettings {
            band_below: 0.10,
            band_above: 0.10,
            logical_margin: ManagerConfig::PAPER_LOGICAL_MARGIN,
            move_bytes_per_sec: tundra_node::config::DEFAULT_MOVE_BYTES_PER_SEC,
            every: None,
            policy: Policy::CompressionAware,
        }
    }
}

/// The shortest period `rebalance_every` takes: a round plans from every node's usage, so
/// rounds closer than this would mostly measure the previous round's moves in flight.
pub const REBALANCE_EVERY_MIN: std::time::Duration = std::time::Duration::from_millis(500);

/// `rebalance_every`'s text: "off", or a whole number followed by `ms`, `s`, `m` or `h`, at
/// least [`REBALANCE_EVERY_MIN`].
pub fn parse_period(text: &str) -> Result<Option<std::time::Duration>, String> {
    parse_period_at_least(text, REBALANCE_EVERY_MIN, "the rounds")
}

/// A period's text as [`parse_period`] reads it, at least `min`; `what` names what "off"
/// turns off, for the error.
pub fn parse_period_at_least(
    text: &str,
    min: std::time::Duration,
    what: &str,
) -> Result<Option<std::time::Duration>, String> {
    let text = text.trim();
    if text == "off" {
        return Ok(None);
    }
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 =
        number.parse().map_err(|_| "write \"off\" or a number with ms, s, m or h, as \"60s\"".to_string())?;
    let millis_per = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "" => return Err("the number needs a unit: ms, s, m or h".into()),
        other => return Err(format!("unknown unit {other:?}: write ms, s, m or h")),
    };
    let millis = number.checked_mul(millis_per).ok_or("a period too long")?;
    let period = std::time::Duration::from_millis(millis);
    if period < min {
        return Err(format!("shorter than {} ms (write \"off\" to turn {what} off)", min.as_millis()));
    }
    Ok(Some(period))
}

/// A move a plan holds, in the terms the command line prints.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedMove {
    pub volume: String,
    pub volume_id: u32,
    pub chunk: u32,
    pub from: u64,
    pub to: u64,
    pub reason: String,
    /// The chunk's size as the decisions count it.
    pub logical_bytes: u64,
    pub physical_bytes: u64,
}

/// A move that failed and was rolled back, not to be planned again in this run: the plans go
/// around it (tundra-cluster's `plan_excluding`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SkippedMove {
    pub volume_id: u32,
    pub chunk: u32,
    pub to: u64,
}

/// The planner's exclusions for `skip`.
fn excluded(skip: &[SkippedMove]) -> std::collections::BTreeSet<(ChunkId, NodeId)> {
    skip.iter().map(|s| (ChunkId::new(VolumeId(s.volume_id), s.chunk), NodeId(s.to))).collect()
}

/// One node as the decisions see it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeZone {
    pub id: u64,
    pub logical_bytes: u64,
    pub physical_bytes: u64,
    pub ratio: Option<f64>,
    /// A, B, C or D; null for a node storing nothing or unknown.
    pub zone: Option<String>,
    /// Its last report is stale: unknown to the plan.
    #[serde(default)]
    pub unknown: bool,
}

/// The cluster's zones: the band and each node's place in it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Zones {
    pub ratio_average: f64,
    pub ratio_low: f64,
    pub ratio_high: f64,
    pub nodes_in_band_fraction: f64,
    pub nodes: Vec<NodeZone>,
}

/// What a rebalance step answers.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RebalanceProgress {
    /// The plan the step found (before its move).
    pub plan: Vec<PlannedMove>,
    /// The move made, if any.
    pub moved: Option<PlannedMove>,
    /// The move tried that failed and was rolled back, with why.
    pub failed: Option<(PlannedMove, String)>,
    /// The failed move was refused as invalid (its target clashes, or is a voter already),
    /// so trying it again would fail again.
    #[serde(default)]
    pub failed_for_good: bool,
    /// The zones before the step and after it (projected: as the decisions count them).
    pub before: Zones,
    pub after: Zones,
    /// A dry run's simulation of the whole sequence from this state: the moves in order and
    /// the zones they would leave.
    pub simulated: Option<Simulation>,
    /// Where the decisions' chunk sizes came from.
    #[serde(default)]
    pub sizes: SizeSources,
}

/// Where the chunk sizes a plan counted came from: the manager's replicated state (the nodes'
/// reports); a chunk it holds no size of yet counts at the size placement expected for it
/// (`unknown`). `from_nodes` is always 0 now that no node is asked at planning time (kept so
/// that older readers of the JSON still find it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizeSources {
    pub from_manager: usize,
    pub from_nodes: usize,
    pub unknown: usize,
    /// Said when any size did not come from the manager's reports, or a node was unknown.
    pub note: Option<String>,
    /// Active nodes whose last report is stale: unknown to the plan.
    #[serde(default)]
    pub unknown_nodes: Vec<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Simulation {
    pub moves: Vec<PlannedMove>,
    pub after: Zones,
}

fn invalid(e: tundra_cluster::Error) -> Refusal {
    Refusal::Invalid(e.message().to_string())
}

impl ClusterNode {
    /// The decision core's view, the one source of decisions: the cluster manager's
    /// replicated state as its leader holds it (every node's capacity and usage and every
    /// chunk's replicas and size, from the nodes' reports: seed 000 §4.2.2), under `config`,
    /// with every node whose last report is older than `REPORT_STALE_AFTER_MS` at the
    /// leader's clock marked unknown (it neither gives nor takes chunks, and counts in no
    /// average). No node is asked anything here; a chunk the manager holds no reported size
    /// for counts at the size placement expected, and the answer says how many.
    pub(crate) fn decision_state(&self, config: ManagerConfig) -> Result<(ClusterState, SizeSources), Refusal> {
        let (mut state, now_unix_ms) = self.block_on(self.manager_state_now())?;
        state.apply(&Command::Configure(config)).map_err(invalid)?;
        let unknown = state.mark_unknown(now_unix_ms);
        let reported = state.chunks().values().filter(|c| c.reported.is_some()).count();
        let mut sources = SizeSources {
            from_manager: reported,
            from_nodes: 0,
            unknown: state.chunks().len() - reported,
            note: None,
            unknown_nodes: unknown.iter().map(|n| n.0).collect(),
        };
        let mut notes = Vec::new();
        if sources.unknown > 0 {
            notes.push(format!(
                "the cluster manager holds no size yet for {} of {} chunks (nodes report the chunks they lead \
                 every few seconds): counted at their expected size",
                sources.unknown,
                state.chunks().len()
            ));
        }
        if !unknown.is_empty() {
            let list: Vec<String> = sources.unknown_nodes.iter().map(u64::to_string).collect();
            notes.push(format!(
                "node {} reported nothing for over {} ms: unknown, neither given nor taking chunks",
                list.join(", "),
                tundra_cluster::REPORT_STALE_AFTER_MS
            ));
        }
        if !notes.is_empty() {
            sources.note = Some(notes.join("; "));
        }
        Ok((state, sources))
    }

    /// One step of `tundra cluster rebalance`: plan under `policy` and, unless `dry_run`, carry
    /// out the plan's first move not in `skip`.
    /// A step that moves holds the claim on moves for `owner` (manager.rs), waiting for another
    /// mover's to end; a command-line run gives it back once its plan is empty or a step fails
    /// (a background round gives it back at the round's end).
    pub fn rebalance_step(
        &self,
        policy: &str,
        dry_run: bool,
        skip: &[SkippedMove],
        owner: MoveOwner,
    ) -> Result<RebalanceProgress, Refusal> {
        let policy = Policy::parse(policy).map_err(invalid)?;
        if dry_run {
            return self.claimed_rebalance_step(policy, dry_run, skip);
        }
        self.block_on(self.claim_moves(owner))?;
        let step = self.claimed_rebalance_step(policy, dry_run, skip);
        let ended = !matches!(&step, Ok(progress) if !progress.plan.is_empty());
        if ended && matches!(owner, MoveOwner::Rebalance { .. }) {
            self.block_on(self.release_moves(owner));
        }
        step
    }

    /// [`ClusterNode::rebalance_step`] once it holds the claim on moves (or for a dry run).
    fn claimed_rebalance_step(
        &self,
        policy: Policy,
        dry_run: bool,
        skip: &[SkippedMove],
    ) -> Result<RebalanceProgress, Refusal> {
        self.block_on(self.settle_all());
        let (mut state, sizes) = self.decision_state(self.rebalance.manager_config(policy))?;
        let before = zones(&state);
        let moves: Vec<Move> = state.plan_excluding(&excluded(skip)).moves;
        let plan: Vec<PlannedMove> = moves.iter().map(|m| self.planned(&state, m)).collect();
        if dry_run || moves.is_empty() {
            let simulated = dry_run.then(|| self.simulate(state.clone(), skip));
            return Ok(RebalanceProgress {
                plan,
                moved: None,
                failed: None,
                failed_for_good: false,
                after: before.clone(),
                before,
                simulated,
                sizes,
            });
        }
        let first = moves[0];
        let planned = plan[0].clone();
        state.apply(&Command::BeginMove(first)).map_err(invalid)?;
        let def = self
            .catalog
            .lock()
            .get(first.chunk.volume().0)
            .cloned()
            .ok_or_else(|| Refusal::Invalid(format!("volume id {} is gone", first.chunk.volume().0)))?;
        let started = std::time::Instant::now();
        let done = self.block_on(self.execute(&def, first.chunk.index(), first.from.0, first.to.0));
        let failed_for_good = matches!(done, Err(Refusal::Invalid(_)));
        let (moved, failed) = match done {
            Ok(()) => {
                state.apply(&Command::FinishMove { chunk: first.chunk }).map_err(invalid)?;
                self.pace_after(started, planned.physical_bytes);
                (Some(planned), None)
            }
            Err(why) => {
                state.apply(&Command::AbortMove { chunk: first.chunk }).map_err(invalid)?;
                (None, Some((planned, format!("{why:?}"))))
            }
        };
        let after = zones(&state);
        Ok(RebalanceProgress { plan, moved, failed, failed_for_good, before, after, simulated: None, sizes })
    }

    /// Pacing in the executor (pace.rs): a move that took less than its chunk's physical bytes
    /// at `[cluster] move_bytes_per_sec` is followed by a pause until it did, so that moves
    /// one after the other keep to the rate whichever way their learners caught up.
    fn pace_after(&self, started: std::time::Instant, physical_bytes: u64) {
        let rate = self.rebalance.move_bytes_per_sec;
        if rate == 0 {
            return;
        }
        let due = started + std::time::Duration::from_secs_f64(physical_bytes as f64 / rate as f64);
        // In slices, so that shutdown does not wait out a long pause.
        while !self.stopping.load(std::sync::atomic::Ordering::Relaxed) {
            let now = std::time::Instant::now();
            if now >= due {
                break;
            }
            std::thread::sleep((due - now).min(std::time::Duration::from_millis(100)));
        }
    }

    /// The steps a rebalance would take from `state` if no size changed: each plan's first move
    /// begun and finished, until the plan is empty.
    fn simulate(&self, mut state: ClusterState, skip: &[SkippedMove]) -> Simulation {
        let mut moves = Vec::new();
        let mut excluded = excluded(skip);
        while moves.len() < SIMULATED_MOVES_MAX {
            let Some(next) = state.plan_excluding(&excluded).moves.into_iter().next() else { break };
            moves.push(self.planned(&state, &next));
            // As the run it predicts: a chunk moved is not sent back to the node it left.
            excluded.insert((next.chunk, next.from));
            let begun = state.apply(&Command::BeginMove(next)).is_ok();
            assert!(begun, "a planned move is accepted by the state that planned it");
            let finished = state.apply(&Command::FinishMove { chunk: next.chunk }).is_ok();
            assert!(finished, "a begun move finishes");
        }
        Simulation { moves, after: zones(&state) }
    }

    fn planned(&self, state: &ClusterState, m: &Move) -> PlannedMove {
        let size = state.chunk(m.chunk).map_or(Space::ZERO, |c| c.size);
        let volume = self.catalog.lock().get(m.chunk.volume().0).map(|d| d.name.clone()).unwrap_or_default();
        PlannedMove {
            volume,
            volume_id: m.chunk.volume().0,
            chunk: m.chunk.index(),
            from: m.from.0,
            to: m.to.0,
            reason: m.reason.name().to_string(),
            logical_bytes: size.logical_bytes,
            physical_bytes: size.physical_bytes,
        }
    }
}

/// The state's zones, from the active nodes' projected usage.
pub fn zones(state: &ClusterState) -> Zones {
    let thresholds = state.thresholds();
    let summary = state.summary();
    let nodes = state
        .nodes()
        .iter()
        .map(|(id, n)| {
            let used = n.projected();
            NodeZone {
                id: id.0,
                logical_bytes: used.logical_bytes,
                physical_bytes: used.physical_bytes,
                ratio: used.ratio(),
                zone: if n.unknown { None } else { thresholds.zone(used).map(|z: Zone| z.name().to_string()) },
                unknown: n.unknown,
            }
        })
        .collect();
    Zones {
        ratio_average: thresholds.ratio_average,
        ratio_low: thresholds.ratio_low,
        ratio_high: thresholds.ratio_high,
        nodes_in_band_fraction: summary.nodes_in_band_fraction,
        nodes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rebalance_every_parses_and_bad_text_is_refused() {
        assert_eq!(parse_period("off").unwrap(), None);
        assert_eq!(parse_period("60s").unwrap(), Some(Duration::from_secs(60)));
        assert_eq!(parse_period("500ms").unwrap(), Some(Duration::from_millis(500)));
        assert_eq!(parse_period(" 5m ").unwrap(), Some(Duration::from_secs(300)));
        assert_eq!(parse_period("2h").unwrap(), Some(Duration::from_secs(7200)));
        for (bad, why) in [
            ("60", "needs a unit"),
            ("s", "write \"off\""),
            ("10x", "unknown unit"),
            ("100ms", "shorter than 500 ms"),
            ("-5s", "write \"off\""),
            ("99999999999999999999h", "write \"off\""),
            ("9999999999999999h", "too long"),
        ] {
            let error = parse_period(bad).unwrap_err();
            assert!(error.contains(why), "{bad}: {error}");
        }
    }

    #[test]
    fn the_background_keys_are_read_and_checked() {
        let config = ClusterConfig {
            rebalance_every: Some("2s".into()),
            rebalance_policy: Some("logical".into()),
            ..ClusterConfig::default()
        };
        let settings = RebalanceSettings::from_config(&config).unwrap();
        assert_eq!(settings.every, Some(Duration::from_secs(2)));
        assert_eq!(settings.policy, Policy::Logical);
        let default = RebalanceSettings::from_config(&ClusterConfig::default()).unwrap();
        assert_eq!((default.every, default.policy), (None, Policy::CompressionAware));
        let bad = ClusterConfig { rebalance_policy: Some("size".into()), ..ClusterConfig::default() };
        assert!(RebalanceSettings::from_config(&bad).unwrap_err().contains("rebalance_policy"));
        let bad = ClusterConfig { rebalance_every: Some("1".into()), ..ClusterConfig::default() };
        assert!(RebalanceSettings::from_config(&bad).unwrap_err().contains("rebalance_every"));
    }
}
