//! The seam between the protocol and the node: the server decodes a request, calls one method of
//! a [`Service`], and encodes what it returns. The node implements the trait; `mem.rs` has an
//! in-memory implementation for tests.

use std::fmt;

use crate::codes::Status;
use crate::types::{HeavyResult, VolumeInfo, VolumeSpec, WriteMode};

/// What a node does for its clients. Called concurrently from one thread per connection; a
/// connection's own requests arrive one at a time, in the order it sent them.
pub trait Service: Send + Sync {
    fn volume_lookup(&self, name: &str) -> Result<VolumeInfo, ServiceError>;
    fn volume_create(&self, spec: VolumeSpec) -> Result<VolumeInfo, ServiceError>;
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
}

/// A refused request: the status the client gets and a message for a person.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceError {
    /// Never [`Status::Ok`]; the server sends `INTERNAL` if it is.
    pub code: Status,
    pub message: String,
}

impl ServiceError {
    pub fn new(code: Status, message: impl Into<String>) -> ServiceError {
        ServiceError { code, message: message.into() }
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
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for ServiceError {}
