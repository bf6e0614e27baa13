//! The native protocol: how database engines and the `tundra` command line talk to a node.
//!
//! This crate owns the wire format (the hello, frames, request and reply bodies, opcodes and
//! statuses) and the server side: [`Server`] accepts connections and runs each one on its own
//! thread, calling a [`Service`] that the node implements. It knows nothing of how pages are
//! stored, nor how redo records are encoded: version 2's redo opcodes ([`redo`]) carry records
//! as opaque bytes. [`mem::MemService`] is an in-memory service for tests. The specification
//! follows; it is also `docs/protocol.md`.
//!
#![doc = include_str!("../../../docs/protocol.md")]

mod codes;
mod conn;
mod dispatch;
pub mod frame;
pub mod mem;
pub mod message;
pub mod redo;
mod server;
mod service;
mod types;
mod wire;

pub use codes::{Opcode, Status};
pub use frame::{MAX_BODY_BYTES, VERSION_MAX, VERSION_MIN};
pub use message::{DecodeError, Reply, Request};
pub use redo::{
    AppendOutcome, BatchLsns, LATEST_LSN, LeaseRenewal, MAX_PAGES_PER_READ, PageList, PageLsns, PageRead, PagesRead,
    ReadAt, ReaderLease, RedoAppend, RedoStatus, ServedPage, ServedPages,
};
pub use server::{Server, ServerConfig, ShutdownReport};
pub use service::{Service, ServiceError};
pub use types::{HeavyResult, VolumeInfo, VolumeMode, VolumeSpec, WriteMode};
