//! The native protocol: how database engines and the `tundra` command line talk to a node.
//!
//! This crate owns the wire format (the hello, frames, request and reply bodies, opcodes and
//! statuses) and the server side: [`Server`] accepts connections and runs each one on its own
//! thread, calling a [`Service`] that the node implements. It knows nothing of how pages are
//! stored. [`mem::MemService`] is an in-memory service for tests. The specification follows;
//! it is also `docs/protocol.md`.
//!
#![doc = include_str!("../../../docs/protocol.md")]

mod codes;
mod conn;
pub mod frame;
pub mod mem;
pub mod message;
mod server;
mod service;
mod types;

pub use codes::{Opcode, Status};
pub use frame::{MAX_BODY_BYTES, VERSION_MAX, VERSION_MIN};
pub use message::{DecodeError, Reply, Request};
pub use server::{Server, ServerConfig, ShutdownReport};
pub use service::{Service, ServiceError};
pub use types::{HeavyResult, VolumeInfo, VolumeMode, VolumeSpec, WriteMode};
