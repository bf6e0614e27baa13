//! The node's log of its groups' elections: a line whenever the term of one of its replicas
//! moves (looked at every [`EVERY`]), with the new term and leader, the ones before, and whether
//! this node campaigned for the new term (it voted for itself), with its replica's last log
//! index. What an operator reads to see a group electing again and again, such as a lagging
//! follower's campaigns under load (bench/results/2026-12-01-restart-under-load). A group's
//! first look after it starts here prints nothing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::cluster::ClusterNode;

/// How often the node looks at its groups' terms.
pub const EVERY: Duration = Duration::from_millis(100);

impl ClusterNode {
    pub(crate) fn start_election_log(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        self.spawn(async move {
            let mut seen: BTreeMap<u64, (u64, Option<u64>)> = BTreeMap::new();
            loop {
                tokio::time::sleep(EVERY).await;
                let Some(node) = weak.upgrade() else { return };
                let mut now = BTreeMap::new();
                for group in node.host.groups() {
                    let Ok(raft) = node.host.raft(group) else { continue };
                    let (term, leader, voted_for, last_log) = {
                        let metrics = raft.metrics();
                        let m = metrics.borrow();
                        (m.current_term, m.current_leader, m.vote.leader_id().voted_for(), m.last_log_index)
                    };
                    if let Some(&(was_term, was_leader)) = seen.get(&group.0)
                        && term > was_term
                    {
                        let name =
                            |leader: Option<u64>| leader.map_or("none known".to_string(), |l| format!("node {l}"));
                        eprintln!(
                            "tundra: group {:#x}: term {was_term} -> {term}, leader {} -> {}{}; last log index here {}",
                            group.0,
                            name(was_leader),
                            name(leader),
                            if voted_for == Some(node.me) { "; this node campaigned" } else { "" },
                            last_log.map_or("none".to_string(), |i| i.to_string()),
                        );
                    }
                    now.insert(group.0, (term, leader));
                }
                seen = now;
            }
        });
    }
}
