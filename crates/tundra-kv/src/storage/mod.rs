//! What a compute node needs of storage ([`PageStorage`]): append a redo batch and hear when
//! it is durable, read a page as of an LSN, hold a reader lease, and see a volume's redo
//! watermarks. Two implementations: [`ClientStorage`] speaks the native protocol (version 2) to
//! a node; [`LocalStorage`] builds the same behaviour in process from tundra-redo's pieces, so
//! the whole database runs and is tested without a node.
//!
//! The calls mirror docs/protocol.md's version 2 with the project's own types: LSNs are
//! [`Lsn`], batches are tundra-redo's [`RedoBatch`], and the refusals a node acts on
//! (`TooOld`, `NotYet`, `LeaseLost`) are error kinds carrying their LSN.

mod client;
mod local;

use std::time::Duration;

use tundra_redo::{AppendOutcome, LeaseId, ReaderId, RedoBatch, WriterEpoch};
use tundra_store::ids::{Lsn, VolumeId};

pub use client::ClientStorage;
pub use local::{LocalConfig, LocalStats, LocalStorage};

use crate::{Error, Result};

/// A volume's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VolumeGeometry {
    pub page_size: usize,
    pub page_count: u64,
}

/// The LSN a read is for (Neon's GetPage@LSN, protocol v3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadAt {
    /// The LSN the reader wants the page as of.
    pub request_lsn: Lsn,
    /// The reader's promise: the page did not change in `(not_modified_since, request_lsn]`,
    /// so storage may serve it from any LSN in between.
    pub not_modified_since: Lsn,
    /// The reader's lease, if it holds one.
    pub lease: Option<LeaseId>,
}

/// A page as storage served it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServedPage {
    /// The LSN the page is as of: `not_modified_since <= served_lsn <= request_lsn`.
    pub served_lsn: Lsn,
    /// The LSN of the last record that changed the page (0 for a page never written).
    pub page_lsn: Lsn,
    pub data: Vec<u8>,
}

/// A reader's lease on a volume's history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReaderLease {
    pub id: LeaseId,
    /// The LSN the reader may read at from now on.
    pub granted_lsn: Lsn,
    /// How long the lease lasts without a renewal.
    pub valid_for: Duration,
}

/// What a renewal answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Renewal {
    pub valid_for: Duration,
    /// The volume's LSN_min after the renewal.
    pub lsn_min: Lsn,
}

/// A volume's redo watermarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RedoStatus {
    /// The highest writer epoch the stream has seen: a new writer takes a higher one.
    pub writer_epoch: WriterEpoch,
    /// The end of the last durable batch: a writer resumes with it as `prev_lsn`.
    pub durable_lsn: Lsn,
    /// Pages can be served as of LSNs up to it.
    pub complete_lsn: Lsn,
    /// The lowest LSN a reader may still ask for.
    pub lsn_min: Lsn,
}

/// Storage as a compute node sees it. Every call may be made from several threads.
pub trait PageStorage: Send + Sync {
    /// The volume's page size and page count.
    fn geometry(&self, volume: VolumeId) -> Result<VolumeGeometry>;

    /// Appends a batch to the volume's redo stream; answers once it is durable (`Ok`), or why
    /// it was not taken (`Gap`, `Fenced`). An error leaves the batch's fate unknown.
    fn append_redo(&self, batch: &RedoBatch) -> Result<AppendOutcome>;

    /// The page as of `at` (see [`ReadAt`]); refusals are `TooOld`, `NotYet`, `LeaseLost`
    /// and `Invalid`.
    fn get_page(&self, volume: VolumeId, page: u64, at: ReadAt) -> Result<ServedPage>;

    /// Takes a lease on the volume's history from `start_lsn` on (`TooOld` below LSN_min).
    fn register_reader(&self, volume: VolumeId, reader: ReaderId, start_lsn: Lsn) -> Result<ReaderLease>;

    /// Extends the lease and tells storage how far the reader has applied redo.
    fn renew_reader(&self, volume: VolumeId, lease: LeaseId, apply_lsn: Lsn) -> Result<Renewal>;

    /// Ends the lease; one already gone is not an error.
    fn release_reader(&self, volume: VolumeId, lease: LeaseId) -> Result<()>;

    fn redo_status(&self, volume: VolumeId) -> Result<RedoStatus>;
}

/// Checks a served page against the read and the volume: the LSNs the read allowed, a page
/// LSN not above the served one, exactly one page of bytes. Whatever storage implementation
/// served it, a page that breaks these would be wrong data handed over silently.
pub fn check_served(served: &ServedPage, at: ReadAt, page_size: usize, page: u64) -> Result<()> {
    let admitted = at.not_modified_since <= served.served_lsn && served.served_lsn <= at.request_lsn;
    if !admitted || served.page_lsn > served.served_lsn {
        return Err(Error::corrupted(format!(
            "page {page} read at LSN {} (not modified since {}) was served at {} with page LSN {}",
            at.request_lsn, at.not_modified_since, served.served_lsn, served.page_lsn
        )));
    }
    if served.data.len() != page_size {
        return Err(Error::corrupted(format!(
            "page {page} was served with {} bytes; a page is {page_size}",
            served.data.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
