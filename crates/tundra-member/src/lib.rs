//! A cluster of Tundra nodes (seed 000 §3.2.1, §4.2): replicated volumes whose chunks are Raft
//! groups with replicas on a subset of the nodes placed by tundra-cluster (tundra-raft), the node's shared Raft log in a file of
//! its data directory, one authenticated TCP connection per pair of nodes carrying every
//! group's messages, and page I/O that any node accepts and sends to the chunk's leader.
//!
//! - [`peers`]: `[cluster]` read and checked (ids, addresses, the key rule).
//! - [`wire`]: the handshake with the cluster key and the checked frames.
//! - [`messages`]: what nodes ask each other besides Raft.
//! - [`transport`]: the connections, dialed, redialed and multiplexed.
//! - [`catalog`]: which volumes are replicated, in `cluster-volumes.json`.
//! - [`cluster`]: [`ClusterNode`], built from a node and its config; peers' requests; volume
//!   creation.
//! - [`delete`]: a replicated volume deleted from every node, marked first, finished by each
//!   node even across its restart.
//! - [`resize`]: a replicated volume grown on every node: stores and new chunks first, the
//!   served size after.
//! - [`placement`]: each new chunk's replicas, chosen by tundra-cluster from the nodes' usage.
//! - [`manager`]: the cluster manager's Raft group on its members, the nodes' reports to its
//!   leader, placement and moves through it.
//! - [`manager_members`]: the manager's members replaced (a drained node's, a silent one's
//!   after `manager_replace_after`) and a replaced node's member retired when it comes back.
//! - [`migrate`]: a chunk replica moved by a Raft membership change; drains.
//! - [`dead_nodes`]: a dead node's replicas moved off it after `repair_after`, and a
//!   returning node's catalog caught up from the groups' membership.
//! - [`adopt`]: a returning node adopting the volumes created while it was down, from its
//!   peers' catalogs, unless one clashes with a volume of its own.
//! - [`rebalance`]: `tundra cluster rebalance`'s steps, planned from the manager's chunk sizes.
//! - [`background`]: the manager leader's background rebalance rounds (`rebalance_every`).
//! - `io`: page I/O through the chunks' leaders, with retries that turn failover into a stall.
//! - [`leaders`]: the background leader balancer: a node leading fewer than its share of its
//!   chunk groups campaigns for some, from nodes leading more.
//! - [`redo`]: a replicated volume's redo stream through its own group's leader.
//! - [`status`]: the merged view `tundra cluster status` prints.
//! - [`service`]: the native protocol's service and the NBD exports of a cluster node.
//! - [`mount`]: a volume mounted as a file on a cluster node; a replicated one through its
//!   chunks' leaders, never on the node's store alone.

pub mod abandoned;
pub mod adopt;
pub mod background;
pub mod catalog;
pub mod cluster;
pub mod dead_nodes;
pub mod delete;
pub mod elections;
mod io;
pub mod join;
pub mod leaders;
pub mod manager;
pub mod manager_members;
pub mod messages;
pub mod migrate;
pub mod mount;
pub mod pace;
pub mod peers;
pub mod placement;
pub mod rebalance;
pub mod redo;
pub mod resize;
pub mod service;
pub mod status;
pub mod transport;
pub mod wire;

pub use cluster::ClusterNode;
pub use io::STALL_LIMIT;
pub use service::{ClusterExports, ClusterService};
pub use status::ClusterStatus;
