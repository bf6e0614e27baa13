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
//! A served read carries its plan: the stored image to start from (if any) and the records to
//! apply, and `page_lsn`, the LSN of the page's last change at or below the read point, so the
//! reader can check `page_lsn <= request_lsn`.

use std::sync::Arc;

use tundra_store::ids::Lsn;

use super::apply::{last_will_init, reconstruct, window};
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
#[derive(Clone, Copy, Debug)]
pub struct PageState<'a> {
    /// The LSN of the image the store holds (the last change folded into it); `None` when the
    /// store holds no image: the page was never materialized and reads as zeros.
    pub image_lsn: Option<Lsn>,
    /// The page's records not yet folded, sorted by LSN. Records at or below `image_lsn` are
    /// ignored: the store may hold a newer image than the index has heard of.
    pub records: &'a [Arc<RedoRecord>],
}

/// How to build a served page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadPlan {
    /// The stored image to start from, by its LSN; `None` starts from zeros (no image, or the
    /// first record is a whole page and the image is not needed).
    pub image_lsn: Option<Lsn>,
    /// The records to apply in order, all above `image_lsn` and at or below `lsn`.
    pub records: Vec<Arc<RedoRecord>>,
    /// The version the plan builds.
    pub lsn: Lsn,
}

impl ReadPlan {
    /// The page: `image` is the stored image's bytes when `image_lsn` is set (and ignored
    /// otherwise).
    pub fn rebuild(&self, image: Option<&[u8]>, page_size: usize) -> Result<Vec<u8>> {
        let base = self.image_lsn.map(|lsn| (lsn, image.expect("a plan from an image is rebuilt with its bytes")));
        reconstruct(base, &self.records, self.lsn, page_size)
    }

    /// Device reads the plan costs beyond records held in memory: the image, or nothing.
    pub fn image_reads(&self) -> u32 {
        u32::from(self.image_lsn.is_some())
    }
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
pub fn decide_many<'a>(
    request: GetPage,
    horizon: Horizon,
    pages: impl IntoIterator<Item = PageState<'a>>,
) -> std::result::Result<(Lsn, Vec<Decision>), Decision> {
    let at_lsn = read_point(request, horizon)?;
    Ok((at_lsn, pages.into_iter().map(|page| decide_page(request, horizon, at_lsn, page)).collect()))
}

/// Rules 1 to 3: the LSN the request is served at, or its refusal.
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
    let above_image = window(page.records, page.image_lsn, Lsn(u64::MAX));
    let last_change = above_image.last().map(|r| r.lsn).or(page.image_lsn).unwrap_or(Lsn(0));
    let checked = !injected(Bug::ServeAnyImage);
    if checked && request.request_lsn < horizon.lsn_min && last_change > request.request_lsn {
        return Decision::TooOld { lsn_min: horizon.lsn_min };
    }
    if checked && page.image_lsn.is_some_and(|image_lsn| image_lsn > at_lsn) {
        return Decision::TooOld { lsn_min: horizon.lsn_min };
    }
    let wanted = window(page.records, page.image_lsn, at_lsn);
    let plan = match last_will_init(wanted) {
        Some(i) => ReadPlan { image_lsn: None, records: wanted[i..].to_vec(), lsn: at_lsn },
        None => ReadPlan { image_lsn: page.image_lsn, records: wanted.to_vec(), lsn: at_lsn },
    };
    let page_lsn = wanted.last().map(|r| r.lsn).or(page.image_lsn).unwrap_or(Lsn(0));
    Decision::Serve { at_lsn, page_lsn, plan }
}

#[cfg(test)]
mod tests;
