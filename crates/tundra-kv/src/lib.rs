//! The reference compute node: a small transactional key-value database whose
//! data is a B+tree of 8 KiB pages on a Tundra volume. One read-write (RW) node turns every page
//! change into a redo record and commits a transaction by appending one redo batch; it never
//! writes a page, storage builds pages from redo. Any number of read-only (RO) nodes follow the
//! RW node's commits, read pages as of their own LSN (GetPage@LSN), apply redo to the pages
//! they cache, and answer point reads and range scans consistent with that LSN (seed 000 §2.1;
//! PolarDB's RW ships redo to its ROs the same way).
//!
//! - `storage/`: [`PageStorage`], what a compute node needs of storage, over the native
//!   protocol ([`ClientStorage`]) or in process from tundra-redo's pieces ([`LocalStorage`]).
//! - `page/`: the page format ([`Page`]: header, checksum, slotted cells, the meta page) and
//!   its check when a page is read.
//! - `redo.rs`: page changes turned into redo records, LSNs assigned by bytes of redo.
//! - `pool.rs`: the bounded cache of pages both kinds of node keep.
//! - `tree/`: the B+tree's reads (lookup, scan) and writes (insert, delete, splits).
//! - `rw.rs`: [`RwNode`] and its transactions; `ro.rs`: [`RoNode`].
//! - `workload/`: [`run_workload`], a sysbench-like driver whose every read is checked against
//!   a versioned model at the reader's LSN.
//!
//! Docs: docs/kv.md (page format, the redo each operation produces).

mod error;
pub mod page;
mod pool;
pub mod redo;
pub mod ro;
pub mod rw;
pub mod storage;
mod tree;
pub mod workload;

pub use error::{Error, ErrorKind, Result};
pub use page::{MAX_KEY_BYTES, MAX_VALUE_BYTES, PAGE_SIZE, Page};
pub use ro::{RoConfig, RoNode, RoStats};
pub use rw::{RwConfig, RwNode, RwStats, Txn};
pub use storage::{
    ClientStorage, LocalConfig, LocalStorage, PageStorage, ReadAt, ReaderLease, RedoStatus, Renewal, ServedPage,
    VolumeGeometry,
};
pub use workload::lagging::{LaggingConfig, LaggingReport, run_lagging};
pub use workload::{Mix, WorkloadConfig, WorkloadReport, run_workload, run_workload_with};

/// Bugs the tests inject on purpose, to show that the workload's checker catches what it
/// guards against: each test that injects one expects mismatches. Never injected outside
/// tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bug {
    /// An RO node reads the pages it does not cache at the newest LSN instead of its own.
    ReadsLatest,
    /// An RO node does not apply redo to the pages it caches.
    SkipsRedo,
    /// An RO node applies the batch before each batch it applies once more, without comparing
    /// LSNs: records already in its cached pages are applied again, after newer ones.
    ReappliesRecords,
    /// After storage comes back, a commit whose outcome was unknown is taken as landed
    /// without asking storage.
    InDoubtAlwaysLanded,
}

/// True when a test injected `bug` on this thread; always false outside tests.
#[inline]
pub(crate) fn injected(bug: Bug) -> bool {
    #[cfg(test)]
    return INJECTED.with(|b| b.get() == Some(bug));
    #[cfg(not(test))]
    {
        let _ = bug;
        false
    }
}

#[cfg(test)]
thread_local! {
    static INJECTED: std::cell::Cell<Option<Bug>> = const { std::cell::Cell::new(None) };
}

/// Injects `bug` on this thread until the returned guard drops.
#[cfg(test)]
pub(crate) fn inject(bug: Bug) -> InjectedBug {
    INJECTED.with(|b| b.set(Some(bug)));
    InjectedBug
}

#[cfg(test)]
pub(crate) struct InjectedBug;

#[cfg(test)]
impl Drop for InjectedBug {
    fn drop(&mut self) {
        INJECTED.with(|b| b.set(None));
    }
}
