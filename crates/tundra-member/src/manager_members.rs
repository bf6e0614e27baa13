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

use std::collections::BTreeSet;
use std::sync::Arc;

use tundra_cluster::mover::report_stale;
use tundra_cluster::{NodeId, NodeStatus};
use tundra_raft::manager_machine::{ManagerBug, manager_group};

use crate::cluster::ClusterNode;
use crate::manager::{FileSnapshots, ManagerCall, ManagerReply, SNAPSHOT_FILE, now_unix_ms};
use crate::messages::{Answer, Forward, Refusal};

/// In a node's data directory: the node joined the manager's members after the cluster
/// started (it starts its member at every start).
pub const MEMBER_FILE: &str = "manager.member";
/// In a node's data directory: the node gave its place among the manager's members to
/// another (it never starts its member again, whatever `[cluster] managers` says).
pub const RETIRED_FILE: &str = "manager.retired";

/// How many entries between two of the manager's snapshots (as manager.rs starts its members).
const LOGS_PER_SNAPSHOT: u64 = 1024;

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
        let group = manager_group();
        let (voters, _) = self.host.members(group).map_err(crate::io::refusal)?;
        if !voters.contains(&drained) {
            return Ok(ManagerReply::Done);
        }
        let to = self.member_candidate(&voters, drained)?;
        self.ask(to, Forward::ManagerJoin).await?;
        self.host.add_learner(group, to).await.map_err(crate::io::refusal)?;
        let next: BTreeSet<u64> = voters.iter().copied().filter(|&v| v != drained).chain([to]).collect();
        self.host.change_voters(group, next).await.map_err(crate::io::refusal)?;
        // A drained node that is down already stays out: the group no longer counts it, and its
        // retired mark is written when it next answers a drain of itself.
        let _ = self.ask(drained, Forward::ManagerLeave).await;
        Ok(ManagerReply::Done)
    }

    /// The lowest id that is not a member nor `drained`, active and fresh in the state.
    fn member_candidate(&self, voters: &BTreeSet<u64>, drained: u64) -> Result<u64, Refusal> {
        let view = self.host.manager_view().ok_or(Refusal::NotLeader { leader: None })?;
        let now = now_unix_ms();
        let state = &view.lock().state;
        let up = |id: u64| {
            state
                .node(NodeId(id))
                .is_some_and(|n| n.status == NodeStatus::Active && !report_stale(n.reported_unix_ms, now))
        };
        let mut ids = self.membership.ids();
        ids.sort_unstable();
        ids.into_iter().find(|&id| id != drained && !voters.contains(&id) && up(id)).ok_or_else(|| {
            let list: Vec<String> = voters.iter().map(u64::to_string).collect();
            Refusal::Invalid(format!(
                "node {drained} is a member of the cluster manager (members {}), and no other up node can take its \
                 place; add a node, then drain again",
                list.join(",")
            ))
        })
    }

    /// This node joins the manager's members: its member started (empty; the leader's log or
    /// snapshot fills it) and remembered for its next start.
    pub(crate) async fn join_manager(&self) -> Result<Answer, Refusal> {
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
        let dir = self.node.data_dir();
        tokio::task::block_in_place(|| {
            write_synced(&dir.join(RETIRED_FILE)).and_then(|()| remove_if_present(&dir.join(MEMBER_FILE)))
        })
        .map_err(|e| Refusal::Unavailable(format!("{}: {e}", dir.display())))?;
        self.host.stop_manager_group().await.map_err(Refusal::Unavailable)?;
        Ok(Answer::Done)
    }
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
