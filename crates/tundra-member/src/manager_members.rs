//! The manager's own members (issue 15: "three members ... so the manager survives a node's
//! death"): the group starts on `[cluster] managers` (by default the three lowest ids), and
//! when `tundra cluster drain` empties a node that is one of them, the drain gives that
//! member's place to another node before it reports the node empty, so that the manager
//! keeps three members once the node is retired.
//!
//! The manager's leader does it (`ManagerCall::ReplaceMember`), as migrate.rs moves a chunk's
//! replica: the new node starts an empty member of the group (and remembers it is one in
//! `manager.member` in its data directory, so that it starts it again after a restart), the
//! leader adds it as a learner and waits until it caught up (the log, or the snapshot when
//! the log was purged), then makes the voters the old set without the drained node and with
//! the new one (openraft's joint consensus), and tells the drained node to stop its member
//! (which it then never starts again: `manager.retired`). The new node is the lowest id that
//! is not a member, not the drained node, active in the manager's state and whose report is
//! fresh (an up node). A change cut short (the leader died) is finished by the next drain
//! step, which asks again: the voters tell how far it got.

//! The manager's own members (issue 15: "three members ... so the manager survives a node's
//! death"): the group starts on `[cluster] managers` (by default the three lowest ids), and a
//! member's place passes to another node in two cases:
//!
//! - **a drain**: when `tundra cluster drain` empties a node that is one of them, the drain
//!   gives that member's place to another node before it reports the node empty, so that the
//!   manager keeps three members once the node is retired (`ManagerCall::ReplaceMember`);
//! - **a silent member**: once a report round, the manager's leader looks for a voter whose
//!   last report (the manager's state, `reported_unix_ms`) is older than
//!   `[cluster] manager_replace_after` (60 s by default, never under the 5 s after which a
//!   report is stale, "off" never). It counts the silence from the later of the report and the
//!   time it saw itself lead in this term, so that a leader just elected, or a cluster started
//!   again after a long stop, whose reports are all old, waits a whole period of its own before
//!   it calls anyone dead. It replaces one member at a time (the lowest id), only when an up
//!   node that is not a member exists, and only when the new voters would keep a live majority
//!   (the leader and the nodes whose reports are fresh); otherwise the group keeps its voters
//!   and the leader says why in its log, once. Each replacement is logged and the last one is
//!   in `tundra cluster status` (`manager.last_replacement`).
//!
//! Both go the same way, as migrate.rs moves a chunk's replica: the new node starts an empty
//! member of the group (and remembers it is one in `manager.member` in its data directory, so
//! that it starts it again after a restart), the leader adds it as a learner and waits until
//! it caught up (the log, or the snapshot when the log was purged), then makes the voters the
//! old set without the replaced node and with the new one (openraft's joint consensus), and
//! tells the replaced node to stop its member (which it then never starts again:
//! `manager.retired`). The new node is the lowest id that is not a member, not the replaced
//! node, active in the manager's state and whose report is fresh (an up node). A change cut
//! short (the leader died) is finished by the next drain step, which asks again (the voters
//! tell how far it got), or by the next leader's round, which completes a joint membership it
//! finds before it replaces anyone.
//!
//! **A replaced node that comes back.** A dead node cannot hear `ManagerLeave`, and the leader
//! that replaced it may be dead too when it returns, so the returning node finds out itself:
//! every node whose member's own log lists it as a voter asks the manager's leader (each of its
//! first 10 report rounds, then every 5th) whether it is still in the group
//! (`ManagerCall::MemberCheck`). The leader answers from its membership (voters and learners)
//! and from the node a replacement of its own is adding (asked to join, not yet a learner), so
//! a node being added is never told to leave. A node told it is not a member stops its member
//! and writes `manager.retired`, as `ManagerLeave` does. Starting and stopping the member and
//! this check take one lock on the node, so a `ManagerJoin` that arrives after the leader
//! answered "not a member" starts a fresh member once the check has stopped the old one. Only
//! the node knows it runs a member and what its log says, and the answer comes from whichever
//! node leads now, which is why the node asks rather than the leader pushing.
//!
//! Until then the returning member cannot disturb the group: its log lacks the membership
//! entries that removed it, which every voter of the new set holds, and openraft 0.9 (see
//! `Engine::handle_vote_req`) refuses a vote request whose last log id is behind its own
//! before it looks at the request's term, so its elections raise no one's term and depose no
//! leader; and nobody replicates to it, since no membership lists it.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tundra_cluster::mover::{REPORT_STALE_AFTER_MS, report_stale};
use tundra_cluster::{NodeId, NodeStatus};
use tundra_node::ClusterConfig;
use tundra_raft::manager_machine::{ManagerBug, manager_group};

use crate::cluster::ClusterNode;
use crate::manager::{FileSnapshots, ManagerCall, ManagerReply, SETTLE_LIMIT, SNAPSHOT_FILE, now_unix_ms};
use crate::messages::{Answer, Forward, Refusal};

/// In a node's data directory: the node joined the manager's members after the cluster
/// started (it starts its member at every start).
pub const MEMBER_FILE: &str = "manager.member";
/// In a node's data directory: the node gave its place among the manager's members to
/// another (it never starts its member again, whatever `[cluster] managers` says).
pub const RETIRED_FILE: &str = "manager.retired";

/// How many entries between two of the manager's snapshots (as manager.rs starts its members).
const LOGS_PER_SNAPSHOT: u64 = 1024;
/// `[cluster] manager_replace_after` when absent.
pub const REPLACE_AFTER_DEFAULT: Duration = Duration::from_secs(60);
/// The shortest `manager_replace_after`: a member whose report is not even stale yet is up.
pub const REPLACE_AFTER_MIN: Duration = Duration::from_millis(REPORT_STALE_AFTER_MS);
/// How long the leader waits for a replaced node to answer `ManagerLeave` (a dead one never
/// does; it finds out itself when it comes back).
const LEAVE_WAIT: Duration = Duration::from_secs(2);
/// How long a member's check of its own membership waits for the manager's leader.
const CHECK_WAIT: Duration = Duration::from_secs(3);
/// A member checks its membership at each of its first this many report rounds (a node just
/// restarted finds out quickly), then every [`CHECK_EVERY_ROUNDS`] rounds.
const CHECK_FIRST_ROUNDS: u64 = 10;
const CHECK_EVERY_ROUNDS: u64 = 5;

/// `[cluster] manager_replace_after`, checked at start: None when "off".
pub fn replace_after_from_config(config: &ClusterConfig) -> Result<Option<Duration>, String> {
    match config.manager_replace_after.as_deref() {
        None => Ok(Some(REPLACE_AFTER_DEFAULT)),
        Some(text) => crate::rebalance::parse_period_at_least(text, REPLACE_AFTER_MIN, "the replacement")
            .map_err(|why| format!("[cluster] manager_replace_after = {text:?}: {why}")),
    }
}

/// A test-only hook: `TUNDRA_TEST_MEMBER_REPLACE=off` keeps the leader from replacing a
/// silent member whatever `manager_replace_after` says (the twin of the replacement test).
/// Unset in production.
fn replacement_off_for_test() -> bool {
    std::env::var("TUNDRA_TEST_MEMBER_REPLACE").is_ok_and(|v| v == "off")
}

/// A test-only hook: `TUNDRA_TEST_KEEP_EX_MEMBER=1` keeps a replaced node's member running
/// when it comes back (the twin of the returning node's check). Unset in production.
fn keep_ex_member_for_test() -> bool {
    std::env::var("TUNDRA_TEST_KEEP_EX_MEMBER").is_ok_and(|v| v == "1")
}

/// A replacement of a silent member, as status shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberReplacement {
    /// The silent member.
    pub replaced: u64,
    /// The node that took its place.
    pub by: u64,
    /// How long the replaced member had been silent, as the leader counted it.
    pub silent_ms: u64,
    pub at_unix_ms: u64,
}

/// What a node keeps about the manager's members between calls.
#[derive(Default)]
pub(crate) struct MemberWork {
    /// On the manager's leader: the node a replacement is adding (asked to join, not yet
    /// surely a learner), which a `MemberCheck` counts as a member.
    joining: Mutex<Option<u64>>,
    /// Held while this node starts or stops its member, and over its own `MemberCheck` and
    /// the stop that follows it.
    change: tokio::sync::Mutex<()>,
    /// The term in which this node last saw itself lead the manager, and since when (Unix ms).
    leading_since: Mutex<Option<(u64, u64)>>,
    /// The silent member whose replacement was last found impossible (logged once).
    refused: Mutex<Option<u64>>,
    /// The last replacement of a silent member this node made as the leader.
    pub(crate) last: Mutex<Option<MemberReplacement>>,
}

/// Marks `to` as joining for as long as it lives (a replacement under way).
struct Joining<'a>(&'a MemberWork);

impl<'a> Joining<'a> {
    fn mark(work: &'a MemberWork, to: u64) -> Joining<'a> {
        *work.joining.lock() = Some(to);
        Joining(work)
    }
}

impl Drop for Joining<'_> {
    fn drop(&mut self) {
        *self.0.joining.lock() = None;
    }
}

impl ClusterNode {
    /// Whether this node runs a member of the manager's group at its start: a configured member
    /// that did not give its place away, or a node that joined later.
    pub(crate) fn is_manager_member_at_start(&self) -> bool {
        let dir = self.node.data_dir();
        let configured = self.membership.managers.contains(&self.me) && !dir.join(RETIRED_FILE).exists();
        configured || dir.join(MEMBER_FILE).exists()
    }

    /// The drain's step once `node` holds no chunk: if it is a member of the manager's group,
    /// its place goes to another node first (through the manager's leader).
    pub(crate) async fn manager_member_off(&self, node: u64) -> Result<(), Refusal> {
        match self.to_manager(ManagerCall::ReplaceMember { drained: node }).await? {
            ManagerReply::Done => Ok(()),
            other => Err(Refusal::Unavailable(format!("moving the manager's member answered {other:?}"))),
        }
    }

    /// As the manager's leader: `drained`'s member replaced by an up node that is not one.
    pub(crate) async fn replace_member(&self, drained: u64) -> Result<ManagerReply, Refusal> {
        let (voters, _) = self.host.members(manager_group()).map_err(crate::io::refusal)?;
        if !voters.contains(&drained) {
            return Ok(ManagerReply::Done);
        }
        let to = self.member_candidate(&voters, drained).ok_or_else(|| {
            let list: Vec<String> = voters.iter().map(u64::to_string).collect();
            Refusal::Invalid(format!(
                "node {drained} is a member of the cluster manager (members {}), and no other up node can take its \
                 place; add a node, then drain again",
                list.join(",")
            ))
        })?;
        self.move_member(&voters, drained, to).await?;
        Ok(ManagerReply::Done)
    }

    /// As the manager's leader: `from`'s place among `voters` given to `to` (joined, a learner
    /// caught up, the voters changed), then `from` told to stop its member.
    async fn move_member(&self, voters: &BTreeSet<u64>, from: u64, to: u64) -> Result<(), Refusal> {
        let group = manager_group();
        {
            let _joining = Joining::mark(&self.member_work, to);
            self.ask(to, Forward::ManagerJoin).await?;
            self.host.add_learner(group, to).await.map_err(crate::io::refusal)?;
            let next: BTreeSet<u64> = voters.iter().copied().filter(|&v| v != from).chain([to]).collect();
            self.host.change_voters(group, next).await.map_err(crate::io::refusal)?;
        }
        // A node that is down stays out: the group no longer counts it, and it stops its
        // member itself when it comes back (its `MemberCheck`).
        let _ = tokio::time::timeout(LEAVE_WAIT, self.ask(from, Forward::ManagerLeave)).await;
        Ok(())
    }

    /// The lowest id that is not a member nor `replaced`, active and fresh in the state.
    fn member_candidate(&self, voters: &BTreeSet<u64>, replaced: u64) -> Option<u64> {
        let view = self.host.manager_view()?;
        let now = now_unix_ms();
        let state = &view.lock().state;
        let up = |id: u64| {
            state
                .node(NodeId(id))
                .is_some_and(|n| n.status == NodeStatus::Active && !report_stale(n.reported_unix_ms, now))
        };
        let mut ids = self.membership.ids();
        ids.sort_unstable();
        ids.into_iter().find(|&id| id != replaced && !voters.contains(&id) && up(id))
    }

    /// On the manager's leader, once a report round: the lowest voter silent for
    /// `manager_replace_after` replaced by an up node (module doc).
    pub(crate) async fn replace_silent_member(&self) {
        let Some(after) = self.manager_replace_after else { return };
        if replacement_off_for_test() {
            return;
        }
        let Ok(raft) = self.host.raft(manager_group()) else { return };
        let term = raft.metrics().borrow().current_term;
        let since = {
            let mut leading = self.member_work.leading_since.lock();
            if leading.is_none_or(|(seen, _)| seen != term) {
                *leading = Some((term, now_unix_ms()));
            }
            leading.map_or(0, |(_, since)| since)
        };
        if self.silent_voter(after, since).is_none() {
            return;
        }
        let _turn = self.manager_turn.lock().await;
        if self.host.settle(manager_group(), SETTLE_LIMIT).await.is_err() {
            return;
        }
        let done = self.replace_silent_member_now(after, since).await;
        // Reports wait for the manager's turn while a replacement holds it: the silence of the
        // others is counted again from now, so that the wait makes no live member look dead.
        *self.member_work.leading_since.lock() = Some((term, now_unix_ms()));
        if let Err(why) = done {
            eprintln!("tundra: manager: replacing a silent member: {why:?}");
        }
    }

    /// [`ClusterNode::replace_silent_member`] under the manager's turn: a joint membership left
    /// by a change cut short is finished first; then the silent member (looked for again: a
    /// drain may have replaced it meanwhile) is replaced if the checks allow.
    async fn replace_silent_member_now(&self, after: Duration, since: u64) -> Result<(), Refusal> {
        let group = manager_group();
        let raft = self.host.raft(group).map_err(crate::io::refusal)?;
        let joint = raft.metrics().borrow().membership_config.membership().get_joint_config().clone();
        if let [_, .., last] = joint.as_slice() {
            eprintln!("tundra: manager: finishing a change of members cut short: voters {}", ids(last));
            return self.host.change_voters(group, last.clone()).await.map_err(crate::io::refusal);
        }
        let Some((silent, silent_ms)) = self.silent_voter(after, since) else { return Ok(()) };
        let (voters, _) = self.host.members(group).map_err(crate::io::refusal)?;
        let refuse = |why: String| {
            if self.member_work.refused.lock().replace(silent) != Some(silent) {
                eprintln!("tundra: manager: member {silent} silent for {} s stays a member: {why}", silent_ms / 1000);
            }
            Ok(())
        };
        let Some(to) = self.member_candidate(&voters, silent) else {
            return refuse(format!("no up node outside the members {} can take its place", ids(&voters)));
        };
        let next: BTreeSet<u64> = voters.iter().copied().filter(|&v| v != silent).chain([to]).collect();
        let live = self.live_count(&next);
        if live < next.len() / 2 + 1 {
            return refuse(format!("the members would be {} with {live} of them up, short of a majority", ids(&next)));
        }
        eprintln!(
            "tundra: manager: member {silent} silent for {} s (manager_replace_after {} s): node {to} takes its \
             place",
            silent_ms / 1000,
            after.as_secs()
        );
        self.move_member(&voters, silent, to).await?;
        *self.member_work.refused.lock() = None;
        *self.member_work.last.lock() =
            Some(MemberReplacement { replaced: silent, by: to, silent_ms, at_unix_ms: now_unix_ms() });
        eprintln!("tundra: manager: members now {}", ids(&next));
        Ok(())
    }

    /// The lowest voter other than this leader, known to the state, silent for at least
    /// `after`, counted from the later of its last report and `since` (when this node began
    /// to lead), with how long.
    fn silent_voter(&self, after: Duration, since: u64) -> Option<(u64, u64)> {
        let (voters, _) = self.host.members(manager_group()).ok()?;
        let view = self.host.manager_view()?;
        let state = &view.lock().state;
        let now = now_unix_ms();
        // A voter the state does not hold yet (a state still empty, rebuilt by the first
        // leader once every node answers) is not judged.
        voters.into_iter().filter(|&v| v != self.me).find_map(|v| {
            let last = state.node(NodeId(v))?.reported_unix_ms.unwrap_or(0).max(since);
            let silent_ms = now.saturating_sub(last);
            (silent_ms >= after.as_millis() as u64).then_some((v, silent_ms))
        })
    }

    /// How many of `nodes` are up: this node, and those whose report is fresh.
    fn live_count(&self, nodes: &BTreeSet<u64>) -> usize {
        let Some(view) = self.host.manager_view() else { return 0 };
        let state = &view.lock().state;
        let now = now_unix_ms();
        let fresh = |id: u64| state.node(NodeId(id)).is_some_and(|n| !report_stale(n.reported_unix_ms, now));
        nodes.iter().filter(|&&id| id == self.me || fresh(id)).count()
    }

    /// As the manager's leader: whether `node` is in the group (a voter or a learner) or is the
    /// node a replacement of this leader's is adding.
    pub(crate) fn is_member_now(&self, node: u64) -> Result<bool, Refusal> {
        let (voters, learners) = self.host.members(manager_group()).map_err(crate::io::refusal)?;
        let joining = *self.member_work.joining.lock() == Some(node);
        Ok(voters.contains(&node) || learners.contains(&node) || joining)
    }

    /// On a node whose member's own log lists it as a voter and that does not lead the
    /// manager, at report round `round`: asks the leader whether it is still a member, and
    /// stops its member for good if not (module doc).
    pub(crate) async fn retire_if_replaced(&self, round: u64) {
        if round > CHECK_FIRST_ROUNDS && !round.is_multiple_of(CHECK_EVERY_ROUNDS) {
            return;
        }
        let group = manager_group();
        let Ok((voters, _)) = self.host.members(group) else { return };
        if !voters.contains(&self.me) || self.local_leader(group) == Some(self.me) || keep_ex_member_for_test() {
            return;
        }
        let _change = self.member_work.change.lock().await;
        if self.host.manager_view().is_none() {
            return;
        }
        let asked = self.to_manager_within(ManagerCall::MemberCheck { node: self.me }, CHECK_WAIT).await;
        if let Ok(ManagerReply::Member(false)) = asked {
            eprintln!(
                "tundra: manager: node {} is no longer a member of the manager (its place went to another node while \
                 it was away): its member stops for good",
                self.me
            );
            if let Err(why) = self.retire_here().await {
                eprintln!("tundra: manager: stopping the member: {why:?}");
            }
        }
    }

    /// This node joins the manager's members: its member started (empty; the leader's log or
    /// snapshot fills it) and remembered for its next start.
    pub(crate) async fn join_manager(&self) -> Result<Answer, Refusal> {
        let _change = self.member_work.change.lock().await;
        if self.host.manager_view().is_some() {
            return Ok(Answer::Done);
        }
        let dir = self.node.data_dir();
        let mark = |path: std::path::PathBuf, present: bool| -> Result<(), Refusal> {
            let done = if present { write_synced(&path) } else { remove_if_present(&path) };
            done.map_err(|e| Refusal::Unavailable(format!("{}: {e}", path.display())))
        };
        tokio::task::block_in_place(|| {
            mark(dir.join(RETIRED_FILE), false)?;
            mark(dir.join(MEMBER_FILE), true)
        })?;
        let store = Arc::new(FileSnapshots { path: dir.join(SNAPSHOT_FILE) });
        self.host
            .add_manager_group(store, None, ManagerBug::None, LOGS_PER_SNAPSHOT)
            .await
            .map_err(Refusal::Unavailable)?;
        Ok(Answer::Done)
    }

    /// This node leaves the manager's members: its member stopped, never started again.
    pub(crate) async fn leave_manager(&self) -> Result<Answer, Refusal> {
        let _change = self.member_work.change.lock().await;
        self.retire_here().await
    }

    /// Writes `manager.retired` (and removes `manager.member`), then stops the member; the
    /// caller holds the member's lock.
    async fn retire_here(&self) -> Result<Answer, Refusal> {
        let dir = self.node.data_dir();
        tokio::task::block_in_place(|| {
            write_synced(&dir.join(RETIRED_FILE)).and_then(|()| remove_if_present(&dir.join(MEMBER_FILE)))
        })
        .map_err(|e| Refusal::Unavailable(format!("{}: {e}", dir.display())))?;
        self.host.stop_manager_group().await.map_err(Refusal::Unavailable)?;
        Ok(Answer::Done)
    }
}

/// Node ids as "1,2,4".
fn ids(nodes: &BTreeSet<u64>) -> String {
    nodes.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

/// An empty marker file, durable (the file and its directory synced).
fn write_synced(path: &std::path::Path) -> std::io::Result<()> {
    std::fs::File::create(path)?.sync_all()?;
    sync_parent(path)
}

fn remove_if_present(path: &std::path::Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => sync_parent(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

fn sync_parent(path: &std::path::Path) -> std::io::Result<()> {
    match path.parent() {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manager_replace_after_parses_with_a_floor() {
        let with = |text: Option<&str>| {
            let config = ClusterConfig { manager_replace_after: text.map(String::from), ..ClusterConfig::default() };
            replace_after_from_config(&config)
        };
        assert_eq!(with(None).unwrap(), Some(REPLACE_AFTER_DEFAULT));
        assert_eq!(with(Some("off")).unwrap(), None);
        assert_eq!(with(Some("5s")).unwrap(), Some(Duration::from_secs(5)));
        assert_eq!(with(Some(" 2m ")).unwrap(), Some(Duration::from_secs(120)));
        for (bad, why) in [("2s", "shorter than 5000 ms"), ("60", "needs a unit"), ("soon", "write \"off\"")] {
            let error = with(Some(bad)).unwrap_err();
            assert!(error.contains("manager_replace_after") && error.contains(why), "{bad}: {error}");
        }
    }
}
