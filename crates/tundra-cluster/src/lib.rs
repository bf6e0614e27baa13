//! The cluster manager's decisions (seed 000 §4.2): where a new chunk's replicas go, and which
//! chunk replicas move where, under the paper's original logical policy or its
//! compression-aware scheduling, to repair a dead node, drain one, or fill a new one.
//!
//! [`ClusterState`] is the manager's whole state, changed only by [`Command`]s (heartbeats,
//! chunk stats, nodes joining, draining or lost, placements, moves begun and ended) and asked
//! for [`Plan`]s. It does no I/O, reads no clock and draws no random number, so it can run as a
//! replicated Raft state machine in the real cluster and, unchanged, under [`sim`], which plays
//! a thousand nodes' growth in memory for `tundra sim schedule`. [`summary`] measures the
//! result: zones, the fraction of nodes inside the band, stranded space.

pub mod codec;
pub mod config;
mod error;
pub mod mover;
mod place;
pub mod plan;
pub mod sim;
pub mod state;
pub mod summary;
pub mod usage;

pub use config::{Band, ManagerConfig, Policy, Throttle};
pub use error::{Error, ErrorKind, Result};
pub use mover::{MoveClaim, MoveOwner, REPORT_STALE_AFTER_MS, RoundRecord};
pub use plan::{Move, MoveReason, Plan, Thresholds};
pub use state::{
    Applied, ChunkState, ClusterState, Command, MAX_FIGURE_BYTES, MAX_SIZES_PER_COMMAND, NodeState, NodeStatus,
    ReportedSize,
};
pub use summary::ClusterSummary;
pub use tundra_store::ids::ChunkId;
pub use usage::{NodeId, Space, Zone};
