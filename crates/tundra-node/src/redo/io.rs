//! What a compute node asks of a volume's redo stream: appends (durable when answered),
//! reads of a page at an LSN (Neon's GetPage@LSN rules, decided by `tundra_redo::decide`),
//! reader leases that hold LSN_min back, and the stream's watermarks.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tundra_redo::codec::decode_records;
use tundra_redo::{
    AppendOutcome, Decision, GetPage, LeaseId, LeaseRefusal, ReaderId, RedoBatch, Submitted, WriterEpoch, fetch,
};
use tundra_store::ids::Lsn;

use super::{Stream, StreamCounters, redo_error, stored_lsn};
use crate::node::{Node, VolumeRef};
use crate::{Error, Result};

/// How long a read waits for redo it needs before it answers `NotYet`.
pub const NOT_YET_WAIT: Duration = Duration::from_millis(500);
/// One turn of that wait.
const WAIT_TURN: Duration = Duration::from_millis(50);
/// How long an append waits for room in a full redo log before it is refused.
pub const LOG_FULL_WAIT: Duration = Duration::from_secs(10);
/// How long an append waits for a stream's unapplied redo to fall back under its hard bound
/// (four times `[redo] cache`) before it is refused as `Busy`.
pub const BACKPRESSURE_WAIT: Duration = Duration::from_secs(2);
/// The hard bound on a stream's unapplied redo in memory, in multiples of `[redo] cache`.
pub const HARD_BOUND_FACTOR: u64 = 4;

/// A page served at an LSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServedPage {
    /// The version served: at most the request LSN, at least `not_modified_since`.
    pub served_lsn: Lsn,
    /// The LSN of the page's last change at or below `served_lsn` (0: never changed).
    pub page_lsn: Lsn,
}

/// Why a read at an LSN or a lease was refused, in terms a reader acts on.
#[derive(Debug)]
pub enum RedoRefusal {
    /// The version is gone (or the reader starts below it): read at `lsn_min` or later.
    TooOld { lsn_min: Lsn, message: String },
    /// Redo up to what the read needs is not here yet: retry, or ask another replica.
    NotYet { complete_lsn: Lsn },
    /// The reader's lease is gone (expired, revoked for lagging, released): resync at
    /// `lsn_min` or later and register again.
    LeaseLost { lsn_min: Lsn, message: String },
    /// Anything else (a bad request, an I/O error).
    Error(Error),
}

impl From<Error> for RedoRefusal {
    fn from(error: Error) -> RedoRefusal {
        RedoRefusal::Error(error)
    }
}

/// A reader lease granted or renewed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseGrant {
    pub lease_id: u64,
    pub granted_lsn: Lsn,
    pub valid_for: Duration,
    pub lsn_min: Lsn,
}

/// A stream's watermarks, and what its memory cache, log slots and rebuilt reads hold and did.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct RedoWatermarks {
    pub writer_epoch: u64,
    pub durable_lsn: u64,
    pub complete_lsn: u64,
    pub lsn_min: u64,
    /// Bytes of records held in memory, not yet folded into pages.
    pub unfolded_bytes: u64,
    pub leases: u64,
    /// Records not yet folded that left memory (into slots, or only in the log).
    pub spilled_records: u64,
    /// Records moved out of memory since the node opened the stream.
    pub spilled_records_total: u64,
    /// Whether the stream has per-page log slots.
    pub log_slots: bool,
    /// Times a page's slot had no room for its records since the node opened the stream (the
    /// overflow rule then folded the page or gave it an extra image).
    pub slot_overflows: u64,
    /// Extra images written above LSN_min since the node opened the stream (the overflow
    /// rule), and the image cells holding one now.
    pub extra_images: u64,
    pub image_cells_in_use: u64,
    /// Logical bytes of the stream's slot region holding data, and the drive's physical bytes
    /// for them: what the slots really cost.
    pub slot_mapped_bytes: u64,
    pub slot_physical_bytes: u64,
    /// Reads that rebuilt a page from records, and the device reads they took (images, slots,
    /// redo log batches).
    pub rebuilt_pages: u64,
    pub rebuild_device_reads: u64,
    /// `rebuild_device_reads / rebuilt_pages` (0 before any rebuild).
    pub reads_per_rebuilt_page: f64,
}

impl Node {
    /// Appends a batch of redo from the volume's writer: `records` is `record_count` records in
    /// their documented encoding (docs/format.md, "Redo records"). Answers once the batch is
    /// durable on the fast device; `Gap` and `Fenced` change nothing. The volume's first append
    /// gives it a stream.
    pub fn append_redo(
        &self,
        volume: &VolumeRef,
        epoch: u64,
        prev_lsn: u64,
        end_lsn: u64,
        record_count: u32,
        records: &[u8],
    ) -> Result<AppendOutcome> {
        self.append_redo_as(volume, epoch, prev_lsn, end_lsn, record_count, records, true)
    }

    /// Appends a batch as [`Node::append_redo`] does, but answers once the log has accepted it,
    /// before it is durable: the page versions, the durable LSN the stream answers with and the
    /// leases move at once. For a replicated stream (seed 000 §3.2.1: the batch is durable once
    /// a majority holds it), whose redo group's log is the write-ahead log of its applies
    /// (tundra-raft's `redo_machine`). The batch becomes durable at the log's next group
    /// commit: [`Node::redo_sync`], which the redo group calls before it saves a mark, or a
    /// fold, a spill or a copy of the stream, each of which syncs before it writes anything
    /// that depends on the records. A crash may lose what was not synced; what the log keeps is
    /// a prefix of what was appended, and the group applies the rest again.
    pub fn append_redo_deferred(
        &self,
        volume: &VolumeRef,
        epoch: u64,
        prev_lsn: u64,
        end_lsn: u64,
        record_count: u32,
        records: &[u8],
    ) -> Result<AppendOutcome> {
        self.append_redo_as(volume, epoch, prev_lsn, end_lsn, record_count, records, false)
    }

    /// Makes every batch appended to volume `id`'s stream durable (nothing to do without a
    /// stream, or with nothing deferred).
    pub fn redo_sync(&self, id: tundra_store::ids::VolumeId) -> Result<()> {
        if let Some(stream) = self.redo.stream(id) {
            stream.log.sync().map_err(redo_error)?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn append_redo_as(
        &self,
        volume: &VolumeRef,
        epoch: u64,
        prev_lsn: u64,
        end_lsn: u64,
        record_count: u32,
        records: &[u8],
        sync: bool,
    ) -> Result<AppendOutcome> {
        volume.check_live()?;
        let records = decode_records(records, record_count, volume.volume.page_size).map_err(redo_error)?;
        let pages = volume.volume.page_count();
        if let Some(outside) = records.iter().find(|r| r.page >= pages) {
            return Err(Error::Invalid(format!(
                "the record at LSN {} changes page {} of volume {:?}, which has {pages} pages",
                outside.lsn, outside.page, volume.volume.name
            )));
        }
        let stream = self.redo.stream_or_create(volume)?;
        stream.fit_to(volume);
        self.admit(&stream, volume)?;
        let batch = RedoBatch {
            volume: volume.volume.id,
            epoch: WriterEpoch(epoch),
            prev_lsn: Lsn(prev_lsn),
            end_lsn: Lsn(end_lsn),
            records,
        };
        let outcome = self.append_waiting_for_room(&stream, volume, &batch, sync)?;
        if let AppendOutcome::Ok { .. } = outcome {
            let mut state = stream.state.lock();
            let records = batch.records.into_iter().map(Arc::new).collect();
            state
                .versions
                .records_durable(records, batch.end_lsn)
                .map_err(|e| Error::Io(format!("a durable batch the page versions refuse: {}", e.message())))?;
            state.leases.durable(batch.end_lsn);
            let lsn_min = state.leases.lsn_min();
            state.versions.set_lsn_min(lsn_min);
            stream.advanced.notify_all();
        }
        Ok(outcome)
    }

    /// Backpressure (D8) before an append. Past the cache's bound the writer moves the oldest
    /// records out of memory, unless a fold or spill is already at work on the stream (it would
    /// wait for that fold, which waits for readers). Past [`HARD_BOUND_FACTOR`] times the bound
    /// it waits its turn to spill (which folds or images the pages whose slots are full: the
    /// overflow rule) and folds what LSN_min allows, turn after turn for up to
    /// [`BACKPRESSURE_WAIT`] while readers move on or their leases lapse; if the stream's
    /// memory is still past the hard bound, the batch is refused as `Busy` and nothing changes.
    /// So a stream holds at most the hard bound plus one batch of records in memory.
    fn admit(&self, stream: &Stream, volume: &VolumeRef) -> Result<()> {
        let bound = self.redo.options().cache_bytes;
        let hard = bound.saturating_mul(HARD_BOUND_FACTOR);
        let cached = || stream.state.lock().versions.cached_bytes();
        if cached() <= hard {
            if cached() > bound {
                self.spill_stream(stream, false)?;
            }
            return Ok(());
        }
        let turns = (BACKPRESSURE_WAIT.as_millis() / WAIT_TURN.as_millis()).max(1) as u32;
        for turn in 0..=turns {
            self.spill_stream(stream, true)?;
            if cached() <= hard {
                return Ok(());
            }
            self.fold_stream(stream, volume, 64)?;
            if cached() <= hard {
                return Ok(());
            }
            if turn < turns {
                std::thread::sleep(WAIT_TURN);
            }
        }
        let state = stream.state.lock();
        Err(Error::Busy(format!(
            "volume {:?} holds {} bytes of redo not yet applied, past its bound of {hard} (4 x [redo] cache), and \
             none could be applied or moved out of memory in {} ms: LSN_min {} holds folding back; the batch was \
             not appended, send it again later",
            volume.volume.name,
            state.versions.cached_bytes(),
            BACKPRESSURE_WAIT.as_millis(),
            state.versions.lsn_min()
        )))
    }

    /// Appends `batch` to the stream's log. A full log is backpressure (D8), not yet an error:
    /// the log frees room as pages fold, which waits for LSN_min, so the writer waits up to
    /// [`LOG_FULL_WAIT`] for readers to move on (or for their leases to lapse), folding as it
    /// goes, and only then hears that the stream is full.
    /// Without `sync`, the batch is accepted into the log's next group commit and not waited
    /// for (`append_redo_deferred`).
    fn append_waiting_for_room(
        &self,
        stream: &Stream,
        volume: &VolumeRef,
        batch: &RedoBatch,
        sync: bool,
    ) -> Result<AppendOutcome> {
        let turns = (LOG_FULL_WAIT.as_millis() / WAIT_TURN.as_millis()).max(1) as u32;
        let mut turn = 0;
        loop {
            match stream.log.submit(batch) {
                Err(error) if error.kind() == tundra_redo::ErrorKind::Full && turn < turns => {
                    turn += 1;
                    if self.fold_stream(stream, volume, 1024)? == 0 {
                        std::thread::sleep(WAIT_TURN);
                    }
                }
                Err(error) => return Err(redo_error(error)),
                Ok(Submitted::Refused(outcome)) => return Ok(outcome),
                Ok(Submitted::Accepted(ticket)) if sync => {
                    return Ok(AppendOutcome::Ok { durable_lsn: stream.log.wait(ticket).map_err(redo_error)? });
                }
                Ok(Submitted::Accepted(ticket)) => return Ok(AppendOutcome::Ok { durable_lsn: ticket.end_lsn() }),
            }
        }
    }

    /// Refuses a write that is not redo to a volume whose pages redo makes: its pages carry
    /// the LSNs of the records folded into them, and another write would break that order.
    pub(crate) fn check_not_redo(&self, volume: &VolumeRef) -> Result<()> {
        if self.redo.stream(volume.volume.id).is_some() {
            return Err(Error::Invalid(format!(
                "volume {:?} takes redo: its pages are made from its redo stream, not written",
                volume.volume.name
            )));
        }
        Ok(())
    }

    /// Whether the volume has a redo stream here (its pages are made from redo, not written).
    pub fn takes_redo(&self, volume: &VolumeRef) -> bool {
        self.redo.stream(volume.volume.id).is_some()
    }

    fn stream_of(&self, volume: &VolumeRef) -> Result<Arc<Stream>> {
        volume.check_live()?;
        let stream = self.redo.stream(volume.volume.id).ok_or_else(|| {
            Error::NotFound(format!("volume {:?} has no redo stream: its writer has sent no redo", volume.volume.name))
        })?;
        stream.fit_to(volume);
        Ok(stream)
    }

    /// The page as of `request_lsn` (`u64::MAX`: the newest complete version), given that it
    /// did not change in `(not_modified_since, request_lsn]`. Waits up to [`NOT_YET_WAIT`] for
    /// redo the read needs.
    pub fn read_page_at(
        &self,
        volume: &VolumeRef,
        page: u64,
        request_lsn: u64,
        not_modified_since: u64,
        out: &mut [u8],
    ) -> std::result::Result<ServedPage, RedoRefusal> {
        let stream = self.stream_of(volume)?;
        if page >= volume.volume.page_count() || out.len() != volume.page_size() {
            return Err(Error::Invalid(format!(
                "page {page} of volume {:?} ({} pages of {} bytes) into a buffer of {}",
                volume.volume.name,
                volume.volume.page_count(),
                volume.page_size(),
                out.len()
            ))
            .into());
        }
        let (chunk, page_no) = volume.volume.locate(page).map_err(Error::from)?;
        let request = GetPage { request_lsn: Lsn(request_lsn), not_modified_since: Lsn(not_modified_since) };
        // Bounded in turns of a real-time wait, not by the environment's clock: a simulated clock
        // may never move while a reader waits.
        let turns = (NOT_YET_WAIT.as_millis() / WAIT_TURN.as_millis()).max(1) as u32;
        let mut turn = 0;
        loop {
            let _no_fold = stream.fold_gate.read();
            let mut state = stream.state.lock();
            let stored = stored_lsn(volume, chunk, page_no);
            match state.versions.get_page(page, stored, request) {
                Decision::Serve { at_lsn, page_lsn, plan } => {
                    drop(state);
                    let image = match plan.image_lsn {
                        Some(_) => volume.pages.read_page(chunk, page_no).map_err(Error::from)?,
                        None => None,
                    };
                    let (fetched, spill_reads) = match &plan.spilled {
                        Some(read) => {
                            let fetched = fetch(read, stream.slots.as_ref(), &stream.log).map_err(redo_error)?;
                            let reads = u64::from(fetched.device_reads());
                            (fetched.records, reads)
                        }
                        None => (Vec::new(), 0),
                    };
                    let content =
                        plan.rebuild_with(image.as_deref(), &fetched, volume.page_size()).map_err(redo_error)?;
                    if !plan.records.is_empty() || plan.spilled.is_some() {
                        let counters = &stream.counters;
                        StreamCounters::add(&counters.rebuilt_pages, 1);
                        StreamCounters::add(
                            &counters.rebuild_device_reads,
                            u64::from(plan.image_reads()) + spill_reads,
                        );
                    }
                    out.copy_from_slice(&content);
                    return Ok(ServedPage { served_lsn: at_lsn, page_lsn });
                }
                Decision::TooOld { lsn_min } => {
                    let message = format!(
                        "page {page} of volume {:?} changed since LSN {request_lsn}, below LSN_min {lsn_min}: read at \
                         {lsn_min} or later",
                        volume.volume.name
                    );
                    return Err(RedoRefusal::TooOld { lsn_min, message });
                }
                Decision::BadRequest { reason } => return Err(Error::Invalid(reason.to_string()).into()),
                Decision::NotYet { complete_lsn } => {
                    drop(_no_fold);
                    if turn == turns {
                        return Err(RedoRefusal::NotYet { complete_lsn });
                    }
                    turn += 1;
                    // Woken by an append, or at the end of the turn.
                    stream.advanced.wait_for(&mut state, WAIT_TURN);
                }
            }
        }
    }

    /// Registers a reader starting at `start_lsn`: LSN_min stays at or below its apply LSN
    /// while its lease lives.
    pub fn register_reader(
        &self,
        volume: &VolumeRef,
        reader: u64,
        start_lsn: u64,
    ) -> std::result::Result<LeaseGrant, RedoRefusal> {
        let stream = self.stream_of(volume)?;
        let mut state = stream.state.lock();
        let lease = match state.leases.register(ReaderId(reader), Lsn(start_lsn)) {
            Ok(lease) => lease,
            Err(refused) => return Err(refusal(refused, state.leases.lsn_min())),
        };
        let lsn_min = state.leases.lsn_min();
        state.versions.set_lsn_min(lsn_min);
        let valid_for = lease.valid_until.saturating_sub(self.clock.now());
        Ok(LeaseGrant { lease_id: lease.id.0, granted_lsn: lease.granted_lsn, valid_for, lsn_min })
    }

    /// Renews a lease with the reader's apply LSN (never going back).
    pub fn renew_reader(
        &self,
        volume: &VolumeRef,
        lease: u64,
        apply_lsn: u64,
    ) -> std::result::Result<LeaseGrant, RedoRefusal> {
        let stream = self.stream_of(volume)?;
        let mut state = stream.state.lock();
        let renewed = match state.leases.renew(LeaseId(lease), Lsn(apply_lsn)) {
            Ok(renewed) => renewed,
            Err(refused) => return Err(refusal(refused, state.leases.lsn_min())),
        };
        let lsn_min = state.leases.lsn_min();
        state.versions.set_lsn_min(lsn_min);
        let valid_for = renewed.valid_until.saturating_sub(self.clock.now());
        Ok(LeaseGrant { lease_id: lease, granted_lsn: Lsn(apply_lsn), valid_for, lsn_min: renewed.lsn_min })
    }

    /// Ends a lease; true if it was held.
    pub fn release_reader(&self, volume: &VolumeRef, lease: u64) -> Result<bool> {
        let stream = self.stream_of(volume)?;
        let mut state = stream.state.lock();
        let held = state.leases.release(LeaseId(lease));
        let lsn_min = state.leases.lsn_min();
        state.versions.set_lsn_min(lsn_min);
        Ok(held)
    }

    /// The stream's writer epoch and durable LSN (0 and 0 before its first append).
    pub fn redo_position(&self, volume: &VolumeRef) -> Result<(u64, u64)> {
        volume.check_live()?;
        let Some(stream) = self.redo.stream(volume.volume.id) else { return Ok((0, 0)) };
        let durable = stream.state.lock().versions.durable_lsn().0;
        Ok((stream.log.fence().0, durable))
    }

    /// The stream's watermarks and what it holds in memory. A volume whose writer has sent
    /// nothing yet has an empty stream: every LSN is 0, and its writer starts from there.
    pub fn redo_status(&self, volume: &VolumeRef) -> Result<RedoWatermarks> {
        volume.check_live()?;
        let Some(stream) = self.redo.stream(volume.volume.id) else {
            return Ok(RedoWatermarks { log_slots: self.redo.options().log_slots, ..RedoWatermarks::default() });
        };
        let slot_usage = match &stream.slots {
            Some(slots) => {
                let (first, count) = slots.region();
                Some(self.drive.range_usage(first, count)?)
            }
            None => None,
        };
        let counters = &stream.counters;
        let rebuilt_pages = counters.rebuilt_pages.load(Ordering::Relaxed);
        let rebuild_device_reads = counters.rebuild_device_reads.load(Ordering::Relaxed);
        let mut state = stream.state.lock();
        Ok(RedoWatermarks {
            writer_epoch: stream.log.fence().0,
            durable_lsn: state.versions.durable_lsn().0,
            complete_lsn: state.versions.complete_lsn().0,
            lsn_min: state.versions.lsn_min().0,
            unfolded_bytes: state.versions.cached_bytes(),
            leases: state.leases.live_count() as u64,
            spilled_records: state.versions.spilled_records(),
            spilled_records_total: counters.spilled_records.load(Ordering::Relaxed),
            log_slots: stream.slots.is_some(),
            slot_overflows: counters.slot_overflows.load(Ordering::Relaxed),
            extra_images: counters.extra_images.load(Ordering::Relaxed),
            image_cells_in_use: stream.slots.as_ref().map_or(0, |s| u64::from(s.cells().1)),
            slot_mapped_bytes: slot_usage.map_or(0, |u| u.mapped_bytes),
            slot_physical_bytes: slot_usage.map_or(0, |u| u.physical_bytes),
            rebuilt_pages,
            rebuild_device_reads,
            reads_per_rebuilt_page: if rebuilt_pages == 0 {
                0.0
            } else {
                rebuild_device_reads as f64 / rebuilt_pages as f64
            },
        })
    }
}

/// A lease refusal as what the reader does about it: the message says how.
fn refusal(refused: LeaseRefusal, lsn_min: Lsn) -> RedoRefusal {
    match refused {
        LeaseRefusal::TooOld { lsn_min, .. } => RedoRefusal::TooOld { lsn_min, message: refused.to_string() },
        LeaseRefusal::Backwards { .. } => RedoRefusal::Error(Error::Invalid(refused.to_string())),
        _ => RedoRefusal::LeaseLost { lsn_min, message: refused.to_string() },
    }
}
