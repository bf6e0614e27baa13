//! Redo streams (seed 000 §2.1, §3.3.1, §3.3.3; seed 002 §3): a volume's one writer (the RW
//! compute node) sends only redo; storage makes each batch durable on the fast device without
//! compressing it (Opt#1), applies the records to pages in the background, and serves each page
//! at the LSN a reader asks for. Read-only nodes read at their own LSN; pages are materialized
//! only up to LSN_min, the slowest live reader.
//!
//! - `record.rs`: the records and batches a writer sends ([`RedoRecord`], [`Payload`],
//!   [`RedoBatch`]) and what an append answers ([`AppendOutcome`]).
//! - `codec.rs`: their byte encoding, checked field by field when decoded.
//! - `log/`: [`RedoLog`], one volume's redo stream made durable on the fast device, with group
//!   commit, fencing, reads back and a ring truncated once records are persisted elsewhere.
//! - `versions/`: [`PageVersions`], a volume's records not yet folded into the store's
//!   images with its watermarks and fold decisions; [`reconstruct`], a page as of an LSN; and
//!   the GetPage@LSN decision ([`decide`]: serve, `TooOld`, `NotYet`, `BadRequest`).
//! - `slots/`: [`SlotArea`], per-page log slots (Opt#3): records that leave memory before
//!   their page is materialized, one 4 KiB block per page, so a rebuild reads them at once.
//! - `lease.rs`: [`Leases`], readers' leases on LSNs, which give LSN_min.
//!
//! This crate knows volumes' pages by index and LSNs. It knows nothing of networks or of how
//! the store compresses pages.

pub mod codec;
mod error;
pub mod lease;
pub mod log;
pub mod record;
pub mod slots;
pub mod versions;

pub use error::{Error, ErrorKind, Result};
pub use lease::{Lease, LeaseConfig, LeaseId, LeaseRefusal, Leases, ReaderId, Renewed};
pub use log::{BatchReader, LogGeometry, Recovered, RedoLog, Submitted, Ticket};
pub use record::{AppendOutcome, Payload, RedoBatch, RedoRecord, WriterEpoch};
pub use slots::{Fetched, Merge, SlotArea, SlotStats, fetch};
/// Bugs another crate's tests inject on purpose (with the `testing` feature), to show that
/// their oracles catch them: [`testing::inject`] holds `bug` on this thread until its guard
/// drops. Never compiled into a build without that feature.
#[cfg(any(test, feature = "testing"))]
pub mod testing {
    pub use crate::versions::{Bug, InjectedBug, inject};
}

pub use versions::{
    Decision, ExtraImageTask, FoldTask, GetPage, Held, Horizon, PageState, PageVersions, ReadPlan, SlotCleanup,
    SpillRead, SpillTask, SpillTo, decide, decide_many, reconstruct,
};
