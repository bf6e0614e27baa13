//! Replication (seed 000 §3.2.1, Figure 4): one Raft group per chunk, three voters, built on
//! openraft. The leader compresses a page once and proposes the store's command with the
//! encoded images; a write is answered once a majority holds it durably and the leader applied
//! it; followers apply the same bytes and never compress.
//!
//! - [`types`]: the type configuration, the entry (a `StoreCommand`'s bytes), snapshots.
//! - [`runtime`]: tokio with a seeded generator for openraft's election timeouts.
//! - [`codec`]: the bytes of log records and of messages between nodes.
//! - [`log`]: a node's shared Raft log for all its groups, with group commit, in memory or in a
//!   file.
//! - [`mark`]: the apply mark the store journals with each applied command.
//! - [`state_machine`]: a chunk replica as openraft's state machine.
//! - [`network`]: messages tagged with their group, over one transport per node.
//! - [`redo_machine`]: a replicated volume's redo stream as a group of its own.
//! - [`manager_machine`]: the cluster manager's own group, applying `tundra_cluster::Command`s.
//! - [`host`]: a node's groups, its message entry point, the leader's write and read paths.
//! - [`repair`]: bad pages rewritten from a peer's copy, on read and by the background scrub.
//! - `sim` (tests): the deterministic simulation of a cluster and its checkers.

// openraft's storage and network traits fix their error types (`StorageError` is over 200
// bytes); the functions that return them on its behalf cannot box them.
#![allow(clippy::result_large_err)]

pub mod codec;
pub mod host;
pub mod lat;
pub mod log;
pub mod manager_machine;
pub mod mark;
pub mod network;
pub mod redo_machine;
pub mod repair;
pub mod runtime;
pub mod snapshot;
pub mod state_machine;
pub mod types;

mod campaign;
#[cfg(test)]
mod host_timing;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod snapshot_tests;

pub use host::{Error, Host, heartbeat_config};
pub use repair::RepairStats;
pub use types::{GroupId, NodeId, Proposal, Raft, TypeConfig};
