//! A volume's page versions: which records each page has that the store's image does not, how
//! a page is rebuilt as of an LSN, and how a read at an LSN is answered (seed 000 §2.1, §3.3.3;
//! Neon's GetPage@LSN). Everything here is I/O-free: the owner hands in events (records made
//! durable, pages materialized, LSN_min moved) and asks for decisions (which pages to fold,
//! how to serve a read); it reads and writes the devices itself.
//!
//! - `apply.rs`: a record's payload applied to a page buffer, every range checked against the
//!   page size, and [`reconstruct`], a page as of an LSN from an image and records.
//! - `index.rs`: [`PageVersions`], per page the records not yet folded into the store's image,
//!   the watermarks (durable, complete, LSN_min) and the fold decisions (rule D6); `index/`
//!   holds its spill decisions and events (`spill.rs`) and its invariant check (`check.rs`).
//! - `spilled.rs`: records that left memory before their page was materialized: [`SpillTo`]
//!   (slots, or only the redo log), the stub kept of each, and [`SpillRead`], how a plan
//!   names the one slot read or the log ranges that bring them back.
//! - `serve.rs`: the GetPage@LSN decision ([`decide`], [`decide_many`]): serve at an LSN with a
//!   read plan, or `TooOld`, `NotYet`, `BadRequest`.

mod apply;
mod index;
mod serve;
mod spilled;

#[cfg(test)]
mod model_tests;

pub use apply::{apply, check_payload, reconstruct};
pub use index::{ExtraImageTask, FoldTask, PageVersions, SlotCleanup, SpillTask, record_cost_bytes};
pub use serve::{Decision, GetPage, Horizon, PageState, ReadPlan, Spilled, decide, decide_many};
pub(crate) use spilled::log_ranges;
pub use spilled::{Held, LsnRange, SpillRead, SpillTo, SpilledRecord, spills_to_log};

/// Bugs the tests inject on purpose, to show that their oracles catch what they guard against:
/// each test that injects one expects its model check to fail. Never injected outside tests
/// (this crate's, or another crate's built with the `testing` feature: `crate::testing`).
/// The lease table (lease.rs) shares them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    /// Records above the LSN asked for are applied too.
    ApplyPastLsn,
    /// Pages are folded up to the durable LSN, ignoring LSN_min.
    FoldAboveLsnMin,
    /// A read is served from the stored image whatever its LSN, with no horizon check.
    ServeAnyImage,
    /// LSN_min follows the durable LSN, passing the readers' leases.
    LsnMinPassesReaders,
    /// Records that leave memory are dropped without a stub: reads no longer know they need
    /// the page's slot.
    SpillForgetsRecords,
    /// The stream counts as materialized up to the oldest record in memory, passing spilled
    /// ones that only the log holds (with slots off) or that a damaged slot would need.
    TruncatePastSpilled,
    /// An extra image is built as of the page's newest record in memory but kept as the page
    /// at its oldest: readers between the two see changes from their future.
    ExtraImageAtWrongLsn,
}

/// True when a test injected `bug` on this thread; always false outside tests.
#[inline]
pub(crate) fn injected(bug: Bug) -> bool {
    #[cfg(any(test, feature = "testing"))]
    return INJECTED.with(|b| b.get() == Some(bug));
    #[cfg(not(any(test, feature = "testing")))]
    {
        let _ = bug;
        false
    }
}

#[cfg(any(test, feature = "testing"))]
thread_local! {
    static INJECTED: std::cell::Cell<Option<Bug>> = const { std::cell::Cell::new(None) };
}

/// Injects `bug` on this thread until the returned guard drops.
#[cfg(any(test, feature = "testing"))]
pub fn inject(bug: Bug) -> InjectedBug {
    INJECTED.with(|b| b.set(Some(bug)));
    InjectedBug
}

#[cfg(any(test, feature = "testing"))]
pub struct InjectedBug;

#[cfg(any(test, feature = "testing"))]
impl Drop for InjectedBug {
    fn drop(&mut self) {
        INJECTED.with(|b| b.set(None));
    }
}
