//! Leader balancing: every node leads about its share of the chunk groups it is a replica of.
//!
//! A volume's groups are first led by replicas spread evenly over its nodes (cluster.rs's
//! `first_leaders`), but a failover moves a dead node's leaderships to the survivors and
//! nothing gave them back: after one restart of one node of three, the leaders stood 15/15/0,
//! one node served no leader traffic (seed 000 §3.2.1: the leader compresses once and
//! replicates, so it does most of a chunk's work) and the others did twice their share.
//!
//! Every `[cluster] leader_balance_every` each node gathers every live node's view of its
//! groups (the `LocalStatus` that `tundra cluster status` merges) and decides, with
//! [`plan`], the same way on every node given the same view:
//!
//! - only chunk groups count: the volumes' redo groups and the manager's group are left
//!   alone (their leaders carry one stream each, not a share of the page traffic, and a redo
//!   group's leadership moving stalls a volume's whole redo stream);
//! - a node's fair share is, over the groups it is a live voter of, 1/(live voters) each; its
//!   excess is the groups it leads minus that share;
//! - only the node of the lowest excess acts (the lowest id on a tie), so two nodes never
//!   campaign for groups at once on the same view, and it takes a group only from a leader
//!   whose excess is more than one group above its own. That is the rounding rule: a move
//!   from excess `d` to excess `t` changes Σ excess² by 2(t − d + 1), so it happens only when
//!   the sum falls, and balancing ends with every node within one group of the others'
//!   excess (so, with equal shares, within one of its share) and never flaps back;
//! - at most [`TAKES_PER_ROUND`] groups a round, each from the node of highest excess then;
//! - a chunk the catalog lists a move of is left alone (migrate.rs changes its membership
//!   through its leader).
//!
//! The taker takes a group by campaigning (`raft.trigger().elect()`): openraft 0.9.25 has no
//! leadership transfer. A campaign wins only with a vote from a majority, and a voter grants
//! it only when the candidate's log is at least as long as its own and the voter's leader
//! lease has expired; the old leader's lease is counted from its own election and is never
//! renewed on the leader, so once the leader has led for longer than `election_timeout_max`
//! its vote and the candidate's make the majority of three (the other follower, whose lease
//! its heartbeats renew, refuses). So a node campaigns for a group only when its replica
//! applied everything the leader committed and holds every entry the leader had, as the
//! leader reported them, and the group has had the same leader and term for longer than the
//! election timeout ([`GroupReady`]). A campaign that loses (the leader appended an entry in
//! between) costs an election timeout of stall, not an error: the old leader steps down on
//! the candidate's higher term and the group elects again. Clients see a stall of one
//! election in both cases; page I/O already retries through failovers (io.rs `STALL_LIMIT`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tundra_node::ClusterConfig;
use tundra_store::ids::ChunkId;

use crate::cluster::ClusterNode;
use crate::messages::{Answer, Forward, LocalStatus, PeerRequest, PeerResponse};

/// The balancer's period when `[cluster] leader_balance_every` is absent.
pub const DEFAULT_EVERY: Duration = Duration::from_secs(5);
/// Groups one node campaigns for in one round, at most: each transfer stalls that group's
/// clients for about an election, so a restarted node takes its share back over a few rounds
/// rather than all at once.
pub const TAKES_PER_ROUND: usize = 2;
/// How long the balancer waits for each peer's view.
const VIEW_TIMEOUT: Duration = Duration::from_secs(1);

/// `[cluster] leader_balance_every`, checked at start: the balancer's period, None when off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaderBalanceSettings {
    pub every: Option<Duration>,
}

impl LeaderBalanceSettings {
    pub fn from_config(config: &ClusterConfig) -> Result<LeaderBalanceSettings, String> {
        let every = match config.leader_balance_every.as_deref() {
            None => Some(DEFAULT_EVERY),
            Some(text) => parse_every(text).map_err(|why| format!("[cluster] leader_balance_every: {why}"))?,
        };
        Ok(LeaderBalanceSettings { every })
    }
}

/// A period written as a whole number and a unit, `ms`, `s` or `m` ("500ms", "5s", "1m");
/// "off" or a zero period turns the balancer off (None).
pub fn parse_every(text: &str) -> Result<Option<Duration>, String> {
    let text = text.trim();
    if text == "off" {
        return Ok(None);
    }
    let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let bad = || format!("{text:?}: write a whole number and ms, s or m (\"5s\"), or \"off\"");
    let number: u64 = number.parse().map_err(|_| bad())?;
    let every = match unit {
        "ms" => Duration::from_millis(number),
        "s" => Duration::from_secs(number),
        "m" => Duration::from_secs(number.checked_mul(60).ok_or_else(bad)?),
        _ => return Err(bad()),
    };
    Ok((!every.is_zero()).then_some(every))
}

/// One chunk group as the live nodes' views show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupSeen {
    pub group: u64,
    /// The group's voters.
    pub voters: Vec<u64>,
    /// The node that leads it, as the leader itself says, in the highest term reported.
    pub leader: u64,
    pub term: u64,
    /// The leader's last log index and commit index, as it reported them.
    pub leader_last_log: Option<u64>,
    pub leader_committed: Option<u64>,
}

/// A group the acting node campaigns for, and the node that leads it now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Take {
    pub group: u64,
    pub from: u64,
}

/// Each live node's groups led and fair share over `groups` (only live voters count).
pub fn shares(groups: &[GroupSeen], live: &BTreeSet<u64>) -> BTreeMap<u64, (usize, f64)> {
    let mut counts: BTreeMap<u64, (usize, f64)> = live.iter().map(|&n| (n, (0, 0.0))).collect();
    for g in groups {
        let voters: Vec<u64> = g.voters.iter().copied().filter(|v| live.contains(v)).collect();
        if voters.is_empty() || !voters.contains(&g.leader) {
            continue;
        }
        for v in &voters {
            if let Some(count) = counts.get_mut(v) {
                count.1 += 1.0 / voters.len() as f64;
            }
        }
        if let Some(count) = counts.get_mut(&g.leader) {
            count.0 += 1;
        }
    }
    counts
}

/// Excesses closer than this are equal (shares are sums of thirds and the like).
const EPSILON: f64 = 1e-9;

/// What node `me` campaigns for this round: nothing unless it has the lowest excess (lowest
/// id on a tie); then, up to `limit` times, a group of which it is a voter, led by the node of
/// the highest excess (lowest id on a tie) when that excess is more than one group above its
/// own, the lowest group id among those `ready` says it may take. Counts are updated after
/// each take, so a plan never takes more than the rule allows.
pub fn plan(
    groups: &[GroupSeen],
    live: &BTreeSet<u64>,
    me: u64,
    limit: usize,
    ready: impl Fn(&GroupSeen) -> bool,
) -> Vec<Take> {
    let mut counts = shares(groups, live);
    let excess = |counts: &BTreeMap<u64, (usize, f64)>, n: u64| counts.get(&n).map(|&(led, share)| led as f64 - share);
    let lowest = counts.keys().copied().min_by(|&a, &b| {
        let (ea, eb) = (excess(&counts, a).unwrap_or(0.0), excess(&counts, b).unwrap_or(0.0));
        if (ea - eb).abs() < EPSILON { a.cmp(&b) } else { ea.total_cmp(&eb) }
    });
    if lowest != Some(me) {
        return Vec::new();
    }
    let mut takes: Vec<Take> = Vec::new();
    while takes.len() < limit {
        let Some(mine) = excess(&counts, me) else { break };
        // The donors in order: highest excess first, lowest id on a tie.
        let mut donors: Vec<(u64, f64)> = counts
            .keys()
            .filter(|&&n| n != me)
            .filter_map(|&n| excess(&counts, n).map(|e| (n, e)))
            .filter(|&(_, e)| e - mine > 1.0 + EPSILON)
            .collect();
        donors.sort_by(|a, b| if (a.1 - b.1).abs() < EPSILON { a.0.cmp(&b.0) } else { b.1.total_cmp(&a.1) });
        let chosen = donors.iter().find_map(|&(donor, _)| {
            groups
                .iter()
                .filter(|g| g.leader == donor && g.voters.contains(&me))
                .filter(|g| !takes.iter().any(|t| t.group == g.group))
                .find(|g| ready(g))
                .map(|g| Take { group: g.group, from: donor })
        });
        let Some(take) = chosen else { break };
        if let Some(count) = counts.get_mut(&take.from) {
            count.0 -= 1;
        }
        if let Some(count) = counts.get_mut(&me) {
            count.0 += 1;
        }
        takes.push(take);
    }
    takes
}

/// The chunk groups the live nodes' views show with a confirmed leader: a node that names
/// itself leader, in the highest term any view reports for the group (as `tundra cluster
/// status` picks a chunk's leader). Redo groups and the manager's group are left out.
pub fn merge_views(views: &BTreeMap<u64, LocalStatus>) -> Vec<GroupSeen> {
    let mut by_group: BTreeMap<u64, GroupSeen> = BTreeMap::new();
    for (&node, view) in views {
        for g in &view.groups {
            if !tundra_raft::manager_machine::is_chunk_group(ChunkId(g.chunk)) || g.leader != Some(node) {
                continue;
            }
            let seen = GroupSeen {
                group: g.chunk,
                voters: g.voters.clone(),
                leader: node,
                term: g.term,
                leader_last_log: g.last_log_index,
                leader_committed: g.commit_index,
            };
            match by_group.get(&g.chunk) {
                Some(known) if known.term >= seen.term => {}
                _ => {
                    by_group.insert(g.chunk, seen);
                }
            }
        }
    }
    by_group.into_values().collect()
}

/// What the acting node knows of its own replica of a group, for [`GroupReady::ready`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaSeen {
    /// The leader this replica follows.
    pub leader: Option<u64>,
    pub term: u64,
    pub last_log: Option<u64>,
    pub applied: Option<u64>,
}

/// The balancer's memory across rounds: since when each group has had its leader and term.
#[derive(Debug, Default)]
pub struct GroupReady {
    since: BTreeMap<u64, (u64, u64, Instant)>,
}

impl GroupReady {
    /// Notes the leaders of this round's view (forgetting groups no longer in it).
    pub fn observe(&mut self, groups: &[GroupSeen], now: Instant) {
        let mut next = BTreeMap::new();
        for g in groups {
            let since = match self.since.get(&g.group) {
                Some(&(leader, term, since)) if leader == g.leader && term == g.term => since,
                _ => now,
            };
            next.insert(g.group, (g.leader, g.term, since));
        }
        self.since = next;
    }

    /// Whether a campaign by this replica can win without waiting: it follows the group's
    /// leader in the leader's term, it holds and applied everything the leader reported
    /// (last log index, commit index), and the leader has led longer than `lease` (its vote,
    /// granted only once its lease since its election expired, makes the majority).
    pub fn ready(&self, group: &GroupSeen, mine: &ReplicaSeen, lease: Duration, now: Instant) -> bool {
        let steady = self
            .since
            .get(&group.group)
            .is_some_and(|&(leader, term, since)| leader == group.leader && term == group.term && now - since > lease);
        steady
            && mine.leader == Some(group.leader)
            && mine.term == group.term
            && mine.last_log >= group.leader_last_log
            && mine.applied >= group.leader_committed
    }
}

impl ClusterNode {
    /// Starts the background leader balancer (none when `settings` turn it off).
    pub(crate) fn start_leader_balance(self: &Arc<Self>, settings: LeaderBalanceSettings) {
        let Some(every) = settings.every else { return };
        let weak = Arc::downgrade(self);
        self.spawn(async move {
            let mut memory = GroupReady::default();
            loop {
                tokio::time::sleep(every).await;
                let Some(node) = weak.upgrade() else { return };
                node.balance_round(&mut memory).await;
            }
        });
    }

    /// One round: every live node's view, the plan, and a campaign for each group it names.
    async fn balance_round(&self, memory: &mut GroupReady) {
        let views = self.live_views().await;
        let live: BTreeSet<u64> = views.keys().copied().collect();
        // A chunk being moved is left alone: its move's membership changes run on its leader.
        let moving: BTreeSet<u64> = self
            .catalog
            .lock()
            .volumes()
            .iter()
            .flat_map(|def| def.moves.iter().map(|m| ChunkId::new(tundra_store::ids::VolumeId(def.id), m.chunk).0))
            .collect();
        let mut groups = merge_views(&views);
        groups.retain(|g| !moving.contains(&g.group));
        let now = Instant::now();
        memory.observe(&groups, now);
        let ready = |g: &GroupSeen| {
            let Ok(raft) = self.host.raft(ChunkId(g.group)) else { return false };
            // A campaign on demand asks no pre-vote (tundra-raft's campaign.rs): a replica
            // forgotten here once and short of what it held then must not run
            // (tundra-raft's `Host::short_of_held`).
            if self.host.short_of_held(ChunkId(g.group)) {
                return false;
            }
            let lease = Duration::from_millis(raft.config().election_timeout_max);
            let metrics = raft.metrics().borrow().clone();
            let mine = ReplicaSeen {
                leader: metrics.current_leader,
                term: metrics.current_term,
                last_log: metrics.last_log_index,
                applied: metrics.last_applied.map(|id| id.index),
            };
            memory.ready(g, &mine, lease, now)
        };
        for take in plan(&groups, &live, self.me, TAKES_PER_ROUND, ready) {
            let Ok(raft) = self.host.raft(ChunkId(take.group)) else { continue };
            let (led, share) = shares(&groups, &live).get(&self.me).copied().unwrap_or((0, 0.0));
            eprintln!(
                "tundra: leader balance: node {} (leads {led}, share {share:.1}) campaigns for chunk group {:#x} led by node {}",
                self.me, take.group, take.from
            );
            if let Err(why) = raft.trigger().elect().await {
                eprintln!("tundra: leader balance: chunk group {:#x}: {why}", take.group);
            }
        }
    }

    /// This node's view and every peer's that answers within [`VIEW_TIMEOUT`], by node id.
    async fn live_views(&self) -> BTreeMap<u64, LocalStatus> {
        let mut views = BTreeMap::new();
        for id in self.membership.ids() {
            let view = if id == self.me {
                Some(tokio::task::block_in_place(|| self.local_status()))
            } else {
                match self.transport.call(id, &PeerRequest::Forward(Forward::LocalStatus), VIEW_TIMEOUT).await {
                    Ok(PeerResponse::Forward(Ok(Answer::Status(status)))) => Some(status),
                    _ => None,
                }
            };
            if let Some(view) = view {
                views.insert(id, view);
            }
        }
        views
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(group: u64, voters: &[u64], leader: u64) -> GroupSeen {
        GroupSeen {
            group,
            voters: voters.to_vec(),
            leader,
            term: 1,
            leader_last_log: Some(10),
            leader_committed: Some(10),
        }
    }

    /// `groups` on three nodes, led as `leaders` says, group by group.
    fn three(leaders: &[u64]) -> Vec<GroupSeen> {
        leaders.iter().enumerate().map(|(i, &l)| seen(i as u64, &[1, 2, 3], l)).collect()
    }

    fn led(groups: &[GroupSeen], nodes: u64) -> Vec<usize> {
        (1..=nodes).map(|n| groups.iter().filter(|g| g.leader == n).count()).collect()
    }

    /// Every node plans on the same view and does what it planned, round after round, until
    /// no node plans anything; returns the rounds taken and every transfer.
    fn settle(groups: &mut [GroupSeen], live: &BTreeSet<u64>) -> (usize, Vec<Take>) {
        let mut all = Vec::new();
        for round in 0..1000 {
            let takes: Vec<(u64, Take)> = live
                .iter()
                .flat_map(|&me| plan(groups, live, me, TAKES_PER_ROUND, |_| true).into_iter().map(move |t| (me, t)))
                .collect();
            if takes.is_empty() {
                return (round, all);
            }
            for (me, take) in takes {
                let g = groups.iter_mut().find(|g| g.group == take.group).unwrap();
                assert_eq!(g.leader, take.from);
                g.leader = me;
                all.push(take);
            }
        }
        panic!("the leaders never settled: {:?}", led(groups, 5));
    }

    #[test]
    fn a_restarted_node_takes_its_share_back_and_nothing_flaps() {
        let live = BTreeSet::from([1, 2, 3]);
        let mut groups = three(&[[1, 2]; 15].concat());
        let (rounds, takes) = settle(&mut groups, &live);
        assert_eq!(led(&groups, 3), vec![10, 10, 10]);
        // Exactly the ten groups node 3 lacked moved, two a round, none twice.
        assert_eq!(takes.len(), 10);
        assert_eq!(rounds, 5);
        let moved: BTreeSet<u64> = takes.iter().map(|t| t.group).collect();
        assert_eq!(moved.len(), 10);
        // Balanced already (within one): nobody acts.
        for leaders in [vec![1u64; 0], [1, 2, 3].repeat(8), [[1, 2, 3].repeat(8), vec![1]].concat()] {
            let groups = three(&leaders);
            for me in 1..=3 {
                assert!(plan(&groups, &live, me, TAKES_PER_ROUND, |_| true).is_empty(), "{leaders:?}");
            }
        }
    }

    #[test]
    fn only_the_node_of_lowest_excess_acts_and_only_on_ready_groups() {
        let live = BTreeSet::from([1, 2, 3]);
        let groups = three(&[vec![1; 12], vec![2; 10], vec![3; 2]].concat());
        assert!(plan(&groups, &live, 2, TAKES_PER_ROUND, |_| true).is_empty());
        assert!(plan(&groups, &live, 1, TAKES_PER_ROUND, |_| true).is_empty());
        let takes = plan(&groups, &live, 3, TAKES_PER_ROUND, |_| true);
        // From node 1 (excess 4), then from node 1 again (3 against node 2's 2).
        assert_eq!(takes, vec![Take { group: 0, from: 1 }, Take { group: 1, from: 1 }]);
        // Nothing ready, nothing taken; the first ready group is taken.
        assert!(plan(&groups, &live, 3, TAKES_PER_ROUND, |_| false).is_empty());
        assert_eq!(plan(&groups, &live, 3, 1, |g| g.group == 5), vec![Take { group: 5, from: 1 }]);
        // A group led by nobody live, and a node that is down, do not count.
        let live_two = BTreeSet::from([1, 3]);
        let takes = plan(&groups, &live_two, 3, 10, |_| true);
        assert_eq!(takes.len(), 5, "node 3 leads 2 of 14 groups shared with node 1: it takes 5, then 7/7");
    }

    /// The twin of the anti-flapping rule: with "more than its share" alone (any positive gap)
    /// two nodes trade a group back and forth forever; with the rule they settle.
    #[test]
    fn the_gap_of_more_than_one_group_is_what_stops_flapping() {
        let live = BTreeSet::from([1, 2, 3]);
        let mut groups = three(&[[1, 2, 3].repeat(8), vec![1]].concat());
        let (rounds, _) = settle(&mut groups, &live);
        assert_eq!(rounds, 0);
        // The naive rule: the node of lowest excess takes from the highest whenever it is lower.
        let naive = |groups: &[GroupSeen], me: u64| -> Option<Take> {
            let counts = shares(groups, &live);
            let excess = |n: u64| counts[&n].0 as f64 - counts[&n].1;
            let lowest = *counts.keys().min_by(|&&a, &&b| excess(a).total_cmp(&excess(b)).then(a.cmp(&b)))?;
            let highest = *counts.keys().max_by(|&&a, &&b| excess(a).total_cmp(&excess(b)).then(b.cmp(&a)))?;
            (lowest == me && excess(highest) > excess(me) + EPSILON)
                .then(|| groups.iter().find(|g| g.leader == highest).map(|g| Take { group: g.group, from: highest }))
                .flatten()
        };
        let mut flips = 0;
        for _ in 0..20 {
            for me in 1..=3 {
                if let Some(take) = naive(&groups, me) {
                    groups.iter_mut().find(|g| g.group == take.group).unwrap().leader = me;
                    flips += 1;
                }
            }
        }
        assert!(flips >= 20, "the naive rule kept moving leaders: {flips} moves in 20 rounds");
    }

    #[test]
    fn uneven_replica_sets_settle_within_one_of_the_share() {
        // Five nodes, chunks on rotating sets of three, all led by node 1 where it can.
        let live: BTreeSet<u64> = (1..=5).collect();
        let mut groups: Vec<GroupSeen> = (0..50u64)
            .map(|i| {
                let voters = vec![1 + i % 5, 1 + (i + 1) % 5, 1 + (i + 3) % 5];
                let leader = *voters.iter().min().unwrap();
                seen(i, &voters, leader)
            })
            .collect();
        settle(&mut groups, &live);
        let counts = shares(&groups, &live);
        let excesses: Vec<f64> = counts.values().map(|&(l, s)| l as f64 - s).collect();
        let spread =
            excesses.iter().cloned().fold(f64::MIN, f64::max) - excesses.iter().cloned().fold(f64::MAX, f64::min);
        assert!(spread <= 1.0 + EPSILON, "{counts:?}");
    }

    #[test]
    fn readiness_needs_a_caught_up_replica_and_a_steady_leader() {
        let g = seen(7, &[1, 2, 3], 1);
        let lease = Duration::from_millis(300);
        let t0 = Instant::now();
        let mut memory = GroupReady::default();
        memory.observe(std::slice::from_ref(&g), t0);
        let mine = ReplicaSeen { leader: Some(1), term: 1, last_log: Some(10), applied: Some(10) };
        let later = t0 + Duration::from_secs(1);
        assert!(!memory.ready(&g, &mine, lease, t0), "a leader just seen may still hold its lease");
        assert!(memory.ready(&g, &mine, lease, later));
        assert!(!memory.ready(&g, &ReplicaSeen { applied: Some(9), ..mine }, lease, later));
        assert!(!memory.ready(&g, &ReplicaSeen { last_log: Some(9), ..mine }, lease, later));
        assert!(!memory.ready(&g, &ReplicaSeen { leader: Some(2), ..mine }, lease, later));
        assert!(!memory.ready(&g, &ReplicaSeen { term: 2, ..mine }, lease, later));
        // A new term restarts the clock.
        let g2 = GroupSeen { term: 2, ..g.clone() };
        memory.observe(std::slice::from_ref(&g2), later);
        assert!(!memory.ready(&g2, &ReplicaSeen { term: 2, ..mine }, lease, later));
    }

    #[test]
    fn periods_parse_and_bad_ones_are_refused() {
        assert_eq!(parse_every("5s").unwrap(), Some(Duration::from_secs(5)));
        assert_eq!(parse_every("500ms").unwrap(), Some(Duration::from_millis(500)));
        assert_eq!(parse_every("2m").unwrap(), Some(Duration::from_secs(120)));
        assert_eq!(parse_every("0s").unwrap(), None);
        assert_eq!(parse_every("off").unwrap(), None);
        for bad in ["", "5", "s", "-1s", "1.5s", "5 h", "5h", "99999999999999999999s"] {
            assert!(parse_every(bad).is_err(), "{bad:?}");
        }
        let config = ClusterConfig { leader_balance_every: Some("soon".into()), ..ClusterConfig::default() };
        let why = LeaderBalanceSettings::from_config(&config).unwrap_err();
        assert!(why.contains("leader_balance_every"), "{why}");
        assert_eq!(LeaderBalanceSettings::from_config(&ClusterConfig::default()).unwrap().every, Some(DEFAULT_EVERY));
    }

    #[test]
    fn merged_views_keep_confirmed_leaders_of_chunk_groups_only() {
        use crate::messages::GroupView;
        let view = |node: u64, groups: Vec<(u64, Option<u64>, u64)>| LocalStatus {
            node,
            groups: groups
                .into_iter()
                .map(|(chunk, leader, term)| GroupView {
                    volume: 1,
                    chunk,
                    leader,
                    term,
                    last_log_index: Some(5),
                    commit_index: Some(5),
                    applied_index: Some(5),
                    voters: vec![1, 2, 3],
                    purged_index: None,
                })
                .collect(),
            usage: Default::default(),
        };
        let redo = tundra_raft::redo_machine::redo_group(1).0;
        let manager = tundra_raft::manager_machine::manager_group().0;
        let views = BTreeMap::from([
            // Node 1 still believes it leads chunk 10 in term 1; node 2 leads it in term 2.
            (1, view(1, vec![(10, Some(1), 1), (11, Some(1), 1), (redo, Some(1), 1), (manager, Some(1), 1)])),
            (2, view(2, vec![(10, Some(2), 2), (11, Some(1), 1), (12, Some(3), 1)])),
        ]);
        let groups = merge_views(&views);
        let leaders: Vec<(u64, u64)> = groups.iter().map(|g| (g.group, g.leader)).collect();
        // Chunk 12's leader (node 3) did not answer: not confirmed, left out.
        assert_eq!(leaders, vec![(10, 2), (11, 1)]);
    }
}
