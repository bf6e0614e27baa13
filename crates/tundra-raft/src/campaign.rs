//! Who may start an election: a pre-vote in front of openraft's campaigns (Ongaro's thesis,
//! "Consensus: Bridging Theory and Practice", §9.6).
//!
//! openraft 0.9 has no pre-vote. A replica whose election timer fires campaigns with a higher
//! term even when it cannot win, and although the other voters refuse it, its higher term
//! answers the leader's next append, the leader steps down, and the group stalls until it
//! elects again (usually the same leader). Under PostgreSQL's load a follower restarted after
//! a kill did that for both busy chunks (bench/results/2026-12-01-restart-under-load, run 7):
//! it was thousands of entries behind, its leader retried it only every 500 ms and then
//! captured the chunk for it, and meanwhile nothing of the group reached it.
//!
//! So openraft's own election timer is off for every group of more than one voter
//! (`runtime_config().elect(false)`), and each replica runs its own: when no leader's message
//! of the group (an append, a snapshot or a piece of one) has reached this node for a random
//! timeout, openraft's own for a replica that had a leader (`election_timeout_max` plus a
//! draw between the group's two timeouts; after a campaign of its own that ended in no leader,
//! a split vote, the same without the lease), counted from that message or its own last
//! round, it asks the other voters whether they would vote for it
//! ([`Rpc::PreVote`](crate::network::Rpc::PreVote)), and campaigns (`trigger().elect()`) only
//! if a majority of each of the membership's configurations says yes. A voter says yes only if it does not lead the group, has heard no leader of the group
//! for `election_timeout_max` (openraft's leader lease) and the candidate's last log id is at
//! least its own. A pre-vote changes no term, so a replica that cannot win asks again and
//! again and disturbs nothing. A replica forgotten here whose log is still short of what it
//! held then asks nobody ([`crate::host::Host::short_of_held`]).
//!
//! The gate never affects safety, only who starts an election; openraft's vote still decides
//! it. The leader balancer's campaigns (tundra-member leaders.rs) call `trigger().elect()`
//! themselves and ask no pre-vote.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use openraft::LogId;
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::network::{Envelope, Reply, Rpc, Transport};
use crate::types::{GroupId, NodeId, Raft};

/// The gates of a host's groups.
#[derive(Default)]
pub(crate) struct Campaigns {
    gates: Mutex<BTreeMap<GroupId, Arc<Gate>>>,
    /// The injected bug of a twin: openraft's timer decides alone, as before the gate.
    unguarded: AtomicBool,
}

/// One group's gate on this node.
struct Gate {
    raft: Raft,
    /// When a leader's message of the group last reached this node (or the gate started).
    heard: Mutex<Instant>,
    /// The group's election timeouts (openraft's `election_timeout_min` and `_max`).
    timeouts: (Duration, Duration),
    stopped: AtomicBool,
    stop: tokio::sync::Notify,
    /// Whether the replica is still short of what it held when it was forgotten here.
    short_of_held: Box<dyn Fn() -> bool + Send + Sync>,
}

/// What a candidate's pre-vote needs to reach its peers.
pub(crate) struct Reach {
    pub me: NodeId,
    pub group: GroupId,
    pub transport: Arc<dyn Transport>,
    /// The candidate's last log id when it asks.
    pub last: Box<dyn Fn() -> Option<LogId<NodeId>> + Send + Sync>,
}

impl Campaigns {
    /// Gates that hold campaigns, unless `TUNDRA_TEST_CAMPAIGNS_UNGUARDED=1` (a benchmark's
    /// hook, to measure what they spare).
    pub(crate) fn from_env() -> Campaigns {
        let campaigns = Campaigns::default();
        campaigns.set_unguarded(std::env::var("TUNDRA_TEST_CAMPAIGNS_UNGUARDED").is_ok_and(|v| v == "1"));
        campaigns
    }

    /// Turns openraft's timer off for `reach.group`'s replica here and starts the replica's
    /// own timer and pre-votes.
    pub(crate) fn start(
        self: &Arc<Self>,
        reach: Reach,
        raft: &Raft,
        config: &openraft::Config,
        short_of_held: Box<dyn Fn() -> bool + Send + Sync>,
    ) {
        if self.unguarded.load(Ordering::Relaxed) {
            return;
        }
        raft.runtime_config().elect(false);
        let gate = Arc::new(Gate {
            raft: raft.clone(),
            heard: Mutex::new(Instant::now()),
            timeouts: (
                Duration::from_millis(config.election_timeout_min),
                Duration::from_millis(config.election_timeout_max),
            ),
            stopped: AtomicBool::new(false),
            stop: Default::default(),
            short_of_held,
        });
        if let Some(old) = self.gates.lock().insert(reach.group, gate.clone()) {
            old.end();
        }
        tokio::spawn(run(gate, reach));
    }

    /// A leader's message of `group` (an append, a snapshot or a piece of one) reached this
    /// node.
    pub(crate) fn heard_leader(&self, group: GroupId) {
        if let Some(gate) = self.gates.lock().get(&group) {
            *gate.heard.lock() = Instant::now();
        }
    }

    /// This replica's answer to a candidate's pre-vote whose last log id is `candidate`; `own`
    /// is this replica's last log id.
    pub(crate) fn would_vote(
        &self,
        group: GroupId,
        candidate: Option<LogId<NodeId>>,
        own: Option<LogId<NodeId>>,
    ) -> bool {
        let Some(gate) = self.gates.lock().get(&group).cloned() else {
            // A replica without a gate campaigns on openraft's timer (the twin), and one this
            // node does not run has no say.
            return self.unguarded.load(Ordering::Relaxed);
        };
        let leads = gate.raft.metrics().borrow().state.is_leader();
        let heard = *gate.heard.lock();
        !leads && heard.elapsed() >= gate.timeouts.1 && candidate >= own
    }

    /// Ends the gate of a group stopped on this node.
    pub(crate) fn stop(&self, group: GroupId) {
        if let Some(gate) = self.gates.lock().remove(&group) {
            gate.end();
        }
    }

    /// Injects a twin's bug: groups started from now on campaign on openraft's timer alone.
    pub(crate) fn set_unguarded(&self, on: bool) {
        self.unguarded.store(on, Ordering::Relaxed);
    }
}

impl Gate {
    fn end(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        self.stop.notify_one();
    }
}

/// A replica's election timer: after a random timeout with no leader heard, a pre-vote, and a
/// campaign if it passes. A group of this replica alone elects it on openraft's timer, at
/// once. Ends with the gate or the group's Raft.
async fn run(gate: Arc<Gate>, reach: Reach) {
    let (min, max) = gate.timeouts;
    let mut metrics = gate.raft.metrics();
    // The first metrics the group's core publishes (its membership).
    // `biased` everywhere here: an unbiased select draws from tokio's own generator, and a
    // simulated run would no longer replay from its seed.
    tokio::select! {
        biased;
        changed = metrics.changed() => if changed.is_err() { return },
        _ = gate.stop.notified() => return,
    }
    // When this replica's last round ended, and whether it campaigned in it.
    let (mut round_end, mut campaigned) = (Instant::now(), false);
    loop {
        let (alone, membership) = {
            let m = metrics.borrow();
            let configs = m.membership_config.membership().get_joint_config();
            let alone = configs.iter().all(|voters| voters.len() == 1 && voters.contains(&reach.me));
            (alone, m.membership_config.log_id().to_owned())
        };
        gate.raft.runtime_config().elect(alone);
        let heard = *gate.heard.lock();
        // openraft's timeouts: a replica that had a leader waits out the leader's lease too; one
        // that campaigned last (a split vote) only the election timeout.
        let spread = (max.saturating_sub(min).as_millis() as u64).max(1);
        let lease = if campaigned { Duration::ZERO } else { max };
        let timeout = lease + min + Duration::from_millis(crate::runtime::next_u64() % spread);
        tokio::select! {
            biased;
            _ = tokio::time::sleep_until(heard.max(round_end) + timeout) => {}
            _ = gate.stop.notified() => {}
            // A group of this replica alone follows its membership, which may add voters.
            changed = metrics.wait_for(|m| m.membership_config.log_id() != &membership), if alone => {
                if changed.is_err() {
                    return;
                }
            }
        }
        if gate.stopped.load(Ordering::Relaxed) {
            return;
        }
        if *gate.heard.lock() != heard {
            campaigned = false;
            continue;
        }
        let (stopped, leads, configs) = {
            let m = metrics.borrow();
            (m.running_state.is_err(), m.state.is_leader(), m.membership_config.membership().get_joint_config().clone())
        };
        if stopped {
            return;
        }
        let voter = configs.iter().any(|voters| voters.contains(&reach.me));
        let asks = !alone && voter && !leads && !(gate.short_of_held)();
        campaigned = asks && pre_vote(&reach, &configs, min).await;
        if campaigned {
            let _ = gate.raft.trigger().elect().await;
        }
        round_end = Instant::now();
    }
}

/// Asks every other voter of `configs` whether it would vote for this replica; whether a
/// majority of each configuration would (this replica's own vote counted). Answers as soon as
/// one does, without waiting for a peer that is down.
async fn pre_vote(reach: &Reach, configs: &[BTreeSet<NodeId>], wait: Duration) -> bool {
    let last = (reach.last)();
    let peers: BTreeSet<NodeId> = configs.iter().flatten().copied().filter(|&node| node != reach.me).collect();
    let mut asks = tokio::task::JoinSet::new();
    for to in peers {
        let envelope = Envelope { from: reach.me, to, group: reach.group, rpc: Rpc::PreVote { last_log_id: last } };
        let call = reach.transport.call(envelope);
        asks.spawn(async move { (to, matches!(tokio::time::timeout(wait, call).await, Ok(Ok(Reply::PreVote(true))))) });
    }
    let majority = |granted: &BTreeSet<NodeId>| {
        configs.iter().all(|voters| voters.iter().filter(|node| granted.contains(node)).count() * 2 > voters.len())
    };
    let mut granted = BTreeSet::from([reach.me]);
    while !majority(&granted) {
        match asks.join_next().await {
            Some(Ok((node, true))) => {
                granted.insert(node);
            }
            Some(_) => {}
            None => return false,
        }
    }
    true
}
