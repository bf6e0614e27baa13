//! Adding a node to a running cluster (`tundra cluster add-node ID@HOST:PORT`): the node asked
//! links the new node and keeps it in its data directory (peers.rs's `cluster-peers.json`),
//! then tells every other node to do the same, and waits until it is connected to the new
//! node. The new node is started beforehand on an empty data directory with `peers` naming
//! every node, itself included; once linked it reports to the cluster manager, and moves onto
//! it (a rebalance, a drain) adopt the volumes it has not learnt yet (adopt.rs). No node
//! restarts. A node that did not answer (down, or cut off) learns the new node from its peers
//! at its next catalog catch-up (dead_nodes.rs: a few seconds after it starts, then every 30
//! s), or when the command is run again (a node known already is left as it is).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cluster::ClusterNode;
use crate::messages::{Forward, Refusal};

/// How long the node asked waits for a connection to the new node.
const CONNECT_WAIT: Duration = Duration::from_secs(10);
/// How long a node waits for one peer's list of nodes.
const PEERS_WAIT: Duration = Duration::from_secs(3);

/// What an addition did.
#[derive(Debug, Serialize, Deserialize)]
pub struct JoinReport {
    /// The new node's id and peer address.
    pub node: u64,
    pub addr: String,
    /// Whether the node asked did not know it before.
    pub added: bool,
    /// The nodes that linked it (the node asked included), the node asked connected to it.
    pub linked: Vec<u64>,
}

impl ClusterNode {
    /// Links node `id` at `addr` here, kept in the data directory first: false if it was
    /// linked already.
    pub(crate) fn link_peer(&self, id: u64, addr: &str) -> Result<bool, String> {
        let added = self.membership.add(id, addr)?;
        if added {
            self.membership.save_joined(&self.configured_peers, self.node.data_dir())?;
            eprintln!("tundra: node {id} at {addr} joined the cluster");
        }
        self.transport.add_peer(id, addr);
        Ok(added)
    }

    /// Links the nodes its peers know and it does not (a node added while this one was down or
    /// cut off). A node whose id or address clashes with one this node knows is not linked, and
    /// said once in the log: which is right cannot be told here.
    pub(crate) async fn learn_peers(&self) {
        for node in self.membership.ids().into_iter().filter(|&n| n != self.me) {
            let answer = tokio::time::timeout(PEERS_WAIT, self.ask(node, Forward::Peers)).await;
            let Ok(Ok(crate::messages::Answer::Peers(known))) = answer else { continue };
            for (id, addr) in known {
                if self.membership.addr_of(id).is_some_and(|here| here == addr) {
                    continue;
                }
                match self.link_peer(id, &addr) {
                    Ok(_) => eprintln!("tundra: learnt node {id} at {addr} from node {node}'s peers"),
                    Err(why) => {
                        if self.refused_peers.lock().insert((id, addr.clone())) {
                            eprintln!("tundra: node {node} knows node {id} at {addr}, which is not linked here: {why}");
                        }
                    }
                }
            }
        }
    }

    /// Adds node `peer` (`"ID@HOST:PORT"`) to the cluster: linked here, then on every other
    /// node (all must answer), then connected from here (module docs).
    pub(crate) async fn add_node(&self, peer: &str) -> Result<JoinReport, Refusal> {
        let (id, addr) = crate::peers::parse_peer(peer).map_err(Refusal::Invalid)?;
        let added = self.link_peer(id, &addr).map_err(Refusal::Invalid)?;
        let mut linked = vec![self.me];
        let mut missed = Vec::new();
        for node in self.membership.ids().into_iter().filter(|&n| n != self.me && n != id) {
            match self.ask(node, Forward::AddPeer { id, addr: addr.clone() }).await {
                Ok(_) => linked.push(node),
                Err(Refusal::Invalid(why)) => {
                    return Err(Refusal::Invalid(format!("node {node} refused node {id} at {addr}: {why}")));
                }
                Err(why) => missed.push((node, why)),
            }
        }
        if !missed.is_empty() {
            let nodes: Vec<u64> = missed.iter().map(|(n, _)| *n).collect();
            return Err(Refusal::Unavailable(format!(
                "nodes {linked:?} linked node {id}, but nodes {nodes:?} did not answer ({:?}); run the command again \
                 once they are up",
                missed[0].1
            )));
        }
        let deadline = tokio::time::Instant::now() + CONNECT_WAIT;
        while !self.transport.is_connected(id) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if !self.transport.is_connected(id) {
            return Err(Refusal::Unavailable(format!(
                "every node linked node {id} at {addr}, but node {} is not connected to it after {CONNECT_WAIT:?}: is it \
                 running, listening for peers there, with every node in its peers and the cluster's key?",
                self.me
            )));
        }
        Ok(JoinReport { node: id, addr, added, linked })
    }
}
