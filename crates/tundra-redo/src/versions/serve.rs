//! The GetPage@LSN decision (Neon's protocol v3; the notes' §1.2): at which LSN a read is
//! served, from which image and which records, or why it is not.
//!
//! A read names `request_lsn`, the LSN the reader reads at, and `not_modified_since`, the
//! reader's promise that the page did not change in `(not_modified_since, request_lsn]`. With
//! that promise the server need not wait for `request_lsn` itself: once everything up to
//! `not_modified_since` is complete, the page at `min(request_lsn, complete_lsn)` is the page at
//! `request_lsn`. The rules, in the order they are checked:
//!
//! 1. `request_lsn` of 0, or below `not_modified_since`: `BadRequest`, a client's bug.
//! 2. `not_modified_since` above the complete LSN: `NotYet { complete_lsn }`; the caller waits
//!    a bounded time for the stream to catch up and asks again, or tries another replica.
//! 3. The read point is `min(request_lsn, complete_lsn)`.
//! 4. Below LSN_min, versions may have been folded away: a read there is valid only if the
//!    page has not changed since `request_lsn` (its last change is at or below it), else
//!    `TooOld { lsn_min }`. Whether it is served never depends on how far folding got.
//! 5. An image newer than the read point can never give that version: `TooOld`, never the
//!    newer page (Neon's "page version that was garbage collected" bugs, #567, #7692).
//!
//! A served read carries its plan: the stored image to start from (if any), the records to
//! apply from memory and, when the read point needs records that left memory, the one read of
//! the page's log slot or the redo log ranges that hold them (spilled.rs); and `page_lsn`, the
//! LSN of the page's last change at or below the read point, so the reader can check
//! `page_lsn <= request_lsn`. A page rebuilt from its image and its slot costs at most two
//! device reads: the plan names nothing else.

use std::sync::Arc;

use tundra_store::ids::Lsn;

use super::apply::{last_will_init, reconstruct, window, window_by};
use super::spilled::{SpillRead, SpillTo, SpilledRecord};
use super::{Bug, injected};
use crate::Result;
use crate::record::RedoRecord;

/// What a read asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GetPage {
    /// The LSN the reader reads at; `Lsn(u64::MAX)` reads the newest complete version.
    pub request_lsn: Lsn,
    /// The reader's promise: the page did not change in `(not_modified_since, request_lsn]`.
    /// `Lsn(0)` promises nothing.
    pub not_modified_since: Lsn,
}

/// The volume's watermarks a read is decided against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Horizon {
    /// Every record at or below it is known (D5): a version up to it can be built.
    pub complete_lsn: Lsn,
    /// Versions below it may have been folded away.
    pub lsn_min: Lsn,
}

/// One page as the server holds it.
#[derive(Clone, Copy, Debug, Default)]
pub struct PageState<'a> {
    /// The LSN of the image the store holds (the last change folded into it); `None` when the
    /// store holds no image: the page was never materialized and reads as zeros.
    pub image_lsn: Option<Lsn>,
    /// The page's records not yet folded held in memory, sorted by LSN. Records at or below
    /// `image_lsn` are ignored: the store may hold a newer image than the index has heard of.
    pub records: &'a [Arc<RedoRecord>],
    /// The page's records not yet folded that left memory, all older than `records`.
    pub spilled: Spilled<'a>,
}

/// A page's records that left memory: what the index keeps of each, and where they went.
#[derive(Clone, Copy, Debug, Default)]
pub struct Spilled<'a> {
    /// The page: a plan that reads them names it.
    pub page: u64,
    pub to: SpillTo,
    /// Sorted by LSN; those at or below the image's LSN are ignored, as records are.
    pub records: &'a [SpilledRecord],
}

/// How to build a served page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadPlan {
    /// The stored image to start from, by its LSN; `None` starts from zeros (no image, or the
    /// first record is a whole page and the image is not needed).
    pub image_lsn: Option<Lsn>,
    /// The records held in memory to apply in order, all above `image_lsn` and the spilled
    /// ones, and at or below `lsn`.
    pub records: Vec<Arc<RedoRecord>>,
    /// The records that left memory to apply first, and where to read them; `None` when the
    /// version needs none of them.
    pub spilled: Option<SpillRead>,
    /// The version the plan builds.
    pub lsn: Lsn,
}

impl ReadPlan {
    /// The page, for a plan that needs no spilled records: `image` is the stored image's bytes
    /// when `image_lsn` is set (and ignored otherwise). A plan with spilled records is rebuilt
    /// with [`ReadPlan::rebuild_with`]; giving it here is a caller's bug.
    pub fn rebuild(&self, image: Option<&[u8]>, page_size: usize) -> Result<Vec<u8>> {
        assert!(self.spilled.is_none(), "a plan with spilled records is rebuilt with what was read of them");
        self.rebuild_with(image, &[], page_size)
    }

    /// The page: `image` as for [`ReadPlan::rebuild`], `fetched` the records read as `spilled`
    /// says (the slot's records, or the log ranges' records; others are passed over). A record
    /// the plan names that is not among them is `Corrupted`.
    pub fn rebuild_with(&self, image: Option<&[u8]>, fetched: &[RedoRecord], page_size: usize) -> Result<Vec<u8>> {
        let base = self.image_lsn.map(|lsn| (lsn, image.expect("a plan from an image is rebuilt with its bytes")));
        let records = combine(self.spilled.as_ref(), fetched, &self.records)?;
        reconstruct(base, &records, self.lsn, page_size)
    }

    /// Device reads the plan costs for its image: one, or none.
    pub fn image_reads(&self) -> u32 {
        u32::from(self.image_lsn.is_some())
    }

    /// Device reads the plan costs beyond records held in memory: its image, and one read of
    /// the slot or at least one per log range for its spilled records. With slots on, at most
    /// two.
    pub fn device_reads(&self) -> u32 {
        self.image_reads() + self.spilled.as_ref().map_or(0, SpillRead::device_reads)
    }
}

/// The records a rebuild applies, in LSN order: those `spilled` names, picked from `fetched`,
/// then those held in memory (every spilled record is older than every record in memory).
pub(super) fn combine<'a>(
    spilled: Option<&SpillRead>,
    fetched: &'a [RedoRecord],
    memory: &'a [Arc<RedoRecord>],
) -> Result<Vec<&'a RedoRecord>> {
    let mut records = match spilled {
        Some(read) => read.pick(fetched)?,
        None => Vec::new(),
    };
    records.extend(memory.iter().map(|r| r.as_ref()));
    Ok(records)
}

/// The answer to a read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Serve the page as of `at_lsn`, built by `plan`; its last change is at `page_lsn`.
    Serve { at_lsn: Lsn, page_lsn: Lsn, plan: ReadPlan },
    /// The version asked for is below the horizon and the page changed since: the reader is too
    /// far behind and must move to a newer LSN.
    TooOld { lsn_min: Lsn },
    /// Records up to `not_modified_since` are not all here yet.
    NotYet { complete_lsn: Lsn },
    /// The request cannot be right whatever the server's state.
    BadRequest { reason: &'static str },
}

/// Decides a read of one page.
pub fn decide(request: GetPage, horizon: Horizon, page: PageState<'_>) -> Decision {
    match read_point(request, horizon) {
        Ok(at_lsn) => decide_page(request, horizon, at_lsn, page),
        Err(refusal) => refusal,
    }
}

/// Decides a read of many pages at one LSN (prefetch): `Ok` with the read point and, page by
/// page, `Serve` or `TooOld`; `Err` with the refusal (`NotYet`, `BadRequest`) of the whole
/// request.
// A refusal is a `Decision` by value, as a served read is: a read's answer is built once and
// moved once, and boxing it would cost an allocation per read for the sake of the rare refusal.
#[allow(clippy::result_large_err)]
pub fn decide_many<'a>(
    request: GetPage,
    horizon: Horizon,
    pages: impl IntoIterator<Item = PageState<'a>>,
) -> std::result::Result<(Lsn, Vec<Decision>), Decision> {
    let at_lsn = read_point(request, horizon)?;
    Ok((at_lsn, pages.into_iter().map(|page| decide_page(request, horizon, at_lsn, page)).collect()))
}

/// Rules 1 to 3: the LSN the request is served at, or its refusal.
// A refusal is a `Decision` by value, as a served read is: a read's answer is built once and
// moved once, and boxing it would cost an allocation per read for the sake of the rare refusal.
#[allow(clippy::result_large_err)]
fn read_point(request: GetPage, horizon: Horizon) -> std::result::Result<Lsn, Decision> {
    if request.request_lsn == Lsn(0) {
        return Err(Decision::BadRequest { reason: "a read at LSN 0" });
    }
    if request.request_lsn < request.not_modified_since {
        return Err(Decision::BadRequest { reason: "request_lsn is below not_modified_since" });
    }
    if request.not_modified_since > horizon.complete_lsn {
        return Err(Decision::NotYet { complete_lsn: horizon.complete_lsn });
    }
    Ok(request.request_lsn.min(horizon.complete_lsn))
}

/// Rules 4 and 5, then the plan.
fn decide_page(request: GetPage, horizon: Horizon, at_lsn: Lsn, page: PageState<'_>) -> Decision {
    let last_change = last_change_through(page, Lsn(u64::MAX));
    let checked = !injected(Bug::ServeAnyImage);
    if checked && request.request_lsn < horizon.lsn_min && last_change > request.request_lsn {
        return Decision::TooOld { lsn_min: horizon.lsn_min };
    }
    if checked && page.image_lsn.is_some_and(|image_lsn| image_lsn > at_lsn) {
        return Decision::TooOld { lsn_min: horizon.lsn_min };
    }
    let page_lsn = last_change_through(page, at_lsn);
    Decision::Serve { at_lsn, page_lsn, plan: plan_through(page, at_lsn) }
}

/// The LSN of the page's last change at or below `through`: its newest record there above
/// its image, in memory or spilled, else the image's LSN, else 0 (a page never written).
fn last_change_through(page: PageState<'_>, through: Lsn) -> Lsn {
    let memory = window(page.records, page.image_lsn, through);
    let spilled = window_by(page.spilled.records, |s| s.lsn, page.image_lsn, through);
    memory.last().map(|r| r.lsn).or(spilled.last().map(|s| s.lsn)).or(page.image_lsn).unwrap_or(Lsn(0))
}

/// How to build the page as of `lsn`: from the newest whole-page record at or below it if
/// there is one (in memory, or else spilled), else from the image, else from zeros; then
/// every record above that start. The spilled records are read only when the plan needs one.
pub(super) fn plan_through(page: PageState<'_>, lsn: Lsn) -> ReadPlan {
    let memory = window(page.records, page.image_lsn, lsn);
    if let Some(i) = last_will_init(memory) {
        return ReadPlan { image_lsn: None, records: memory[i..].to_vec(), spilled: None, lsn };
    }
    let spilled = window_by(page.spilled.records, |s| s.lsn, page.image_lsn, lsn);
    let (image_lsn, spilled) = match spilled.iter().rposition(|s| s.will_init) {
        Some(i) => (None, &spilled[i..]),
        None => (page.image_lsn, spilled),
    };
    let spilled = (!spilled.is_empty()).then(|| SpillRead::new(page.spilled.page, spilled));
    ReadPlan { image_lsn, records: memory.to_vec(), spilled, lsn }
}

#[cfg(test)]
mod tests;
