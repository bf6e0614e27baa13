//! The seam between the protocol and the node: the server decodes a request, calls one method of
//! a [`Service`], and encodes what it returns. The node implements the trait; `mem.rs` has an
//! in-memory implementation for tests.
//!
//! Version 2's redo methods have default bodies that answer `NOT_SUPPORTED`, so that a service
//! without redo streams keeps compiling and tells clients plainly what it lacks.

use std::fmt;

use crate::codes::{Opcode, Status};
use crate::redo::{AppendOutcome, BatchLsns, LeaseRenewal, PageLsns, ReadAt, ReaderLease, RedoAppend, RedoStatus};
use crate::types::{HeavyResult, VolumeInfo, VolumeSpec, WriteMode};

/// What a node does for its clients. Called concurrently from one thread per connection; a
/// connection's own requests arrive one at a time, in the order it sent them.
pub trait Service: Send + Sync {
    fn volume_lookup(&self, name: &str) -> Result<VolumeInfo, ServiceError>;
    fn volume_create(&self, spec: VolumeSpec) -> Result<VolumeInfo, ServiceError>;
    /// Creates a volume with `replicas` copies on as many nodes of a cluster (more than one;
    /// one copy is [`Service::volume_create`]). A node outside a cluster refuses.
    fn volume_create_replicated(&self, spec: VolumeSpec, replicas: u8) -> Result<VolumeInfo, ServiceError> {
        let _ = spec;
        Err(ServiceError::new(
            Status::Invalid,
            format!("this node is not part of a cluster: a volume of {replicas} replicas needs a [cluster] section"),
        ))
    }
    fn volume_list(&self) -> Result<Vec<VolumeInfo>, ServiceError>;
    fn volume_resize(&self, name: &str, size_bytes: u64) -> Result<VolumeInfo, ServiceError>;
    fn volume_delete(&self, name: &str) -> Result<(), ServiceError>;
    /// `out` is empty on entry; on success it holds exactly the volume's page size in bytes,
    /// zeros for a page never written or trimmed.
    fn read_page(&self, volume: u32, page: u64, out: &mut Vec<u8>) -> Result<(), ServiceError>;
    fn write_page(&self, volume: u32, page: u64, mode: WriteMode, data: &[u8]) -> Result<(), ServiceError>;
    fn trim(&self, volume: u32, first: u64, count: u64) -> Result<(), ServiceError>;
    /// Returns once every write answered before the call is durable; `None` means every volume.
    fn flush(&self, volume: Option<u32>) -> Result<(), ServiceError>;
    fn heavy_compress(&self, volume: u32, first: u64, count: u64) -> Result<HeavyResult, ServiceError>;
    /// Statistics as text, JSON by convention; the node chooses the content.
    fn stats(&self, volume: Option<u32>) -> Result<String, ServiceError>;

    /// Version 2: a cluster operation asked as JSON text, answered as JSON text. A node outside
    /// a cluster refuses.
    fn cluster_admin(&self, request: &str) -> Result<String, ServiceError> {
        let _ = request;
        Err(ServiceError::unsupported(Opcode::ClusterAdmin))
    }

    // Version 2: redo streams, reads at an LSN, reader leases. The server has checked each
    // request against the protocol's own rules (`Request::problem`) before calling.

    /// Appends a batch to the volume's redo stream and returns once it is durable (`Ok`), or
    /// says why it was not taken (`Gap`, `Fenced`). The records are docs/format.md's "Redo
    /// records", `append.record_count` of them.
    fn append_redo(&self, append: &RedoAppend<'_>) -> Result<AppendOutcome, ServiceError> {
        let _ = append;
        Err(ServiceError::unsupported(Opcode::AppendRedo))
    }

    fn redo_status(&self, volume: u32) -> Result<RedoStatus, ServiceError> {
        let _ = volume;
        Err(ServiceError::unsupported(Opcode::RedoStatus))
    }

    /// `out` is empty on entry; on success it holds the page as of the returned `served_lsn`,
    /// exactly the volume's page size. The served LSN must satisfy `at.admits`, and the page's
    /// LSN is at most the served LSN (the server answers `INTERNAL` otherwise). Refusals a
    /// reader acts on: [`ServiceError::too_old`], [`ServiceError::not_yet`] (after a bounded
    /// wait), [`ServiceError::lease_lost`].
    fn get_page_at_lsn(&self, volume: u32, page: u64, at: ReadAt, out: &mut Vec<u8>) -> Result<PageLsns, ServiceError> {
        let _ = (volume, page, at, out);
        Err(ServiceError::unsupported(Opcode::GetPageAtLsn))
    }

    /// As `get_page_at_lsn` for every page of `pages` (at most [`crate::MAX_PAGES_PER_READ`]),
    /// all as of one LSN: `out` gets the pages back to back in the order named, and the reply
    /// one page LSN per page. All or nothing.
    fn get_pages_at_lsn(
        &self,
        volume: u32,
        pages: &[u64],
        at: ReadAt,
        out: &mut Vec<u8>,
    ) -> Result<BatchLsns, ServiceError> {
        let _ = (volume, pages, at, out);
        Err(ServiceError::unsupported(Opcode::GetPagesAtLsn))
    }

    /// Takes a lease that holds the volume's minimum reader LSN at or below the reader's apply
    /// LSN, from `start_lsn` on; [`ServiceError::too_old`] when `start_lsn` is below it already.
    fn register_reader(&self, volume: u32, reader_id: u64, start_lsn: u64) -> Result<ReaderLease, ServiceError> {
        let _ = (volume, reader_id, start_lsn);
        Err(ServiceError::unsupported(Opcode::RegisterReader))
    }

    /// Extends the lease and records how far the reader has applied redo;
    /// [`ServiceError::lease_lost`] when the lease is gone or the reader lags too far.
    fn renew_reader(&self, volume: u32, lease_id: u64, apply_lsn: u64) -> Result<LeaseRenewal, ServiceError> {
        let _ = (volume, lease_id, apply_lsn);
        Err(ServiceError::unsupported(Opcode::RenewReader))
    }

    /// Ends the lease; a lease that is gone already is not an error.
    fn release_reader(&self, volume: u32, lease_id: u64) -> Result<(), ServiceError> {
        let _ = (volume, lease_id);
        Err(ServiceError::unsupported(Opcode::ReleaseReader))
    }
}

/// A refused request: the status the client gets and a message for a person.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceError {
    /// Never [`Status::Ok`]; the server sends `INTERNAL` if it is.
    pub code: Status,
    pub message: String,
    /// The LSN the body carries for a status that [carries one](Status::carries_lsn); the
    /// server sends `INTERNAL` if such a status comes without it. `None` for other statuses.
    pub lsn: Option<u64>,
}

impl ServiceError {
    pub fn new(code: Status, message: impl Into<String>) -> ServiceError {
        ServiceError { code, message: message.into(), lsn: None }
    }
    fn with_lsn(code: Status, lsn: u64, message: impl Into<String>) -> ServiceError {
        ServiceError { code, message: message.into(), lsn: Some(lsn) }
    }
    /// The request asks for history below the volume's minimum reader LSN, `lsn_min`.
    pub fn too_old(lsn_min: u64, message: impl Into<String>) -> ServiceError {
        ServiceError::with_lsn(Status::TooOld, lsn_min, message)
    }
    /// Redo is complete only up to `complete_lsn`, below what the request needs.
    pub fn not_yet(complete_lsn: u64, message: impl Into<String>) -> ServiceError {
        ServiceError::with_lsn(Status::NotYet, complete_lsn, message)
    }
    /// The reader's lease is gone; it resyncs at or above `lsn_min`.
    pub fn lease_lost(lsn_min: u64, message: impl Into<String>) -> ServiceError {
        ServiceError::with_lsn(Status::LeaseLost, lsn_min, message)
    }
    /// This service does not implement `opcode`.
    pub fn unsupported(opcode: Opcode) -> ServiceError {
        ServiceError::new(
            Status::NotSupported,
            format!("this server does not support {opcode}: it keeps no redo streams"),
        )
    }
    pub fn invalid(message: impl Into<String>) -> ServiceError {
        ServiceError::new(Status::Invalid, message)
    }
    pub fn not_found(message: impl Into<String>) -> ServiceError {
        ServiceError::new(Status::NotFound, message)
    }
    pub fn exists(message: impl Into<String>) -> ServiceError {
        ServiceError::new(Status::Exists, message)
    }
    pub fn no_space(message: impl Into<String>) -> ServiceError {
        ServiceError::new(Status::NoSpace, message)
    }
    pub fn corrupted(message: impl Into<String>) -> ServiceError {
        ServiceError::new(Status::Corrupted, message)
    }
    pub fn io(message: impl Into<String>) -> ServiceError {
        ServiceError::new(Status::Io, message)
    }
    pub fn shutting_down(message: impl Into<String>) -> ServiceError {
        ServiceError::new(Status::ShuttingDown, message)
    }
    pub fn internal(message: impl Into<String>) -> ServiceError {
        ServiceError::new(Status::Internal, message)
    }
}

impl fmt::Display for ServiceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.lsn {
            Some(lsn) => write!(f, "{} (LSN {lsn}): {}", self.code, self.message),
            None => write!(f, "{}: {}", self.code, self.message),
        }
    }
}

impl std::error::Error for ServiceError {}
