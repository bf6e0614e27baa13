//! The model test of page versions: random batches, folds (materializations, reported at once
//! or late and out of order), spills of records out of memory, LSN_min moves and reads at
//! random LSNs drive a [`PageVersions`] and what its owner does: a simulated store of page
//! images, a real redo log and a real slot area on memory devices. Every answer is checked
//! against a model that keeps every version of every page. The model applies records its own
//! plain way, and knows the rules (D5, D6 and serve.rs's) only as expectations on answers.
//!
//! Even seeds spill to slots, odd seeds run with slots off (records read back from the log).
//! The harness truncates the log as far as the index says everything is materialized, so a
//! spilled record the index let go of too early would fail its read; it often leaves a slot
//! uncleaned after a fold, as a lazy owner may, so merges overflow and pages stop spilling
//! until folded.
//!
//! Each bug the model guards against is injected in a test of its own, which expects the model
//! to notice. `TUNDRA_MODEL_RUNS` sets the number of seeds (20 by default); `TUNDRA_SEED`
//! replays one.

use std::collections::BTreeMap;
use std::sync::Arc;

use tundra_device::mem::MemDevice;
use tundra_device::{BlockDevice, Lba};
use tundra_env::{Rng, seed_from_env};
use tundra_store::ids::{Lsn, VolumeId};
use tundra_store::store::Watermarks;

use super::{Bug, Decision, GetPage, PageVersions, SlotCleanup, SpillRead, SpillTo, inject, record_cost_bytes};
use crate::log::{LogGeometry, RedoLog};
use crate::record::{Payload, RedoBatch, RedoRecord, WriterEpoch};
use crate::slots::{Merge, SlotArea, fetch};

/// Small pages, so that whole-page records fill a slot in four and merges overflow.
const PAGE_SIZE: usize = 1024;
const VOLUME: VolumeId = VolumeId(9);
/// Pages the writer changes; the volume has two more, never written.
const WRITTEN_PAGES: u64 = 8;
const VOLUME_PAGES: u64 = WRITTEN_PAGES + 2;
const STEPS: usize = 500;

/// Every version of every page, built by applying records in the plainest way.
#[derive(Default)]
struct Model {
    versions: BTreeMap<u64, Vec<(Lsn, Vec<u8>)>>,
}

impl Model {
    /// The page as of `lsn` and the LSN of its last change at or below it (zeros at LSN 0
    /// before its first change).
    fn at(&self, page: u64, lsn: Lsn) -> (Lsn, Vec<u8>) {
        let versions = self.versions.get(&page).map_or(&[][..], |v| &v[..]);
        match versions.iter().rev().find(|(changed, _)| *changed <= lsn) {
            Some((changed, bytes)) => (*changed, bytes.clone()),
            None => (Lsn(0), vec![0; PAGE_SIZE]),
        }
    }

    fn last_change(&self, page: u64) -> Lsn {
        self.versions.get(&page).and_then(|v| v.last()).map_or(Lsn(0), |(lsn, _)| *lsn)
    }

    fn record(&mut self, record: &RedoRecord) {
        let (_, mut bytes) = self.at(record.page, record.lsn);
        match &record.payload {
            Payload::Image(image) => bytes = image.clone(),
            Payload::Ranges(ranges) => {
                for (offset, piece) in ranges {
                    for (i, byte) in piece.iter().enumerate() {
                        bytes[*offset as usize + i] = *byte;
                    }
                }
            }
        }
        self.versions.entry(record.page).or_default().push((record.lsn, bytes));
    }
}

/// Outcomes seen, so a run can show it reached every rule.
#[derive(Default, Debug, Clone, Copy)]
struct Seen {
    served: u64,
    served_below_lsn_min: u64,
    served_from_will_init: u64,
    too_old: u64,
    not_yet: u64,
    bad_request: u64,
    folds: u64,
    late_reports: u64,
    spills: u64,
    overflows: u64,
    served_from_slot: u64,
    served_from_log: u64,
    folds_through_spilled: u64,
}

impl Seen {
    fn add(&mut self, other: &Seen) {
        self.served += other.served;
        self.served_below_lsn_min += other.served_below_lsn_min;
        self.served_from_will_init += other.served_from_will_init;
        self.too_old += other.too_old;
        self.not_yet += other.not_yet;
        self.bad_request += other.bad_request;
        self.folds += other.folds;
        self.late_reports += other.late_reports;
        self.spills += other.spills;
        self.overflows += other.overflows;
        self.served_from_slot += other.served_from_slot;
        self.served_from_log += other.served_from_log;
        self.folds_through_spilled += other.folds_through_spilled;
    }
}

/// One run: the index under test, the store it materializes into, the redo log and slots it
/// spills to, the model, and what the harness itself knows of the watermarks.
struct World {
    seed: u64,
    rng: Rng,
    versions: PageVersions,
    spill_to: SpillTo,
    log: RedoLog,
    slots: SlotArea,
    /// The store's image of each page: its LSN and bytes.
    store: BTreeMap<u64, (Lsn, Vec<u8>)>,
    /// Materializations the store did whose report has not reached the index yet.
    unreported: Vec<(u64, Lsn)>,
    model: Model,
    complete: Lsn,
    durable: Lsn,
    lsn_min: Lsn,
    /// Whether the harness checks each fold task against the fold bound itself; without it,
    /// only reads can notice a fold above LSN_min.
    check_fold_bound: bool,
    seen: Seen,
}

type Step = Result<(), String>;

impl World {
    /// Even seeds spill to slots, odd ones to the log only.
    fn new(seed: u64) -> World {
        let spill_to = if seed.is_multiple_of(2) { SpillTo::Slots } else { SpillTo::Log };
        let geometry = LogGeometry { volume: VOLUME, page_size: PAGE_SIZE as u32, log_blocks: 256 };
        let log_device = Arc::new(MemDevice::new(geometry.total_blocks()));
        RedoLog::format(log_device.as_ref(), geometry).expect("a log on a fresh device");
        let (log, _) = RedoLog::open(log_device).expect("a fresh log opens");
        let slot_device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(VOLUME_PAGES + 2));
        let slots = SlotArea::new(slot_device, Lba(1), VOLUME_PAGES, PAGE_SIZE as u32).expect("an area on the device");
        World {
            seed,
            rng: Rng::new(seed),
            versions: PageVersions::new(PAGE_SIZE, VOLUME_PAGES, Watermarks::default()).spilling_to(spill_to),
            spill_to,
            log,
            slots,
            store: BTreeMap::new(),
            unreported: Vec::new(),
            model: Model::default(),
            complete: Lsn(0),
            durable: Lsn(0),
            lsn_min: Lsn(0),
            check_fold_bound: true,
            seen: Seen::default(),
        }
    }

    fn step(&mut self) -> Step {
        match self.rng.below(100) {
            0..=27 => self.batch(),
            28..=30 => self.bad_batch(),
            31..=32 => self.durable_ahead(),
            33..=42 => self.move_lsn_min(),
            43..=54 => self.fold(),
            55..=58 => self.report_late(),
            59..=67 => self.spill(),
            68..=93 => self.read(),
            _ => self.read_many(),
        }?;
        match self.versions.invariant_problem() {
            Some(problem) => Err(format!("invariant: {problem}")),
            None => Ok(()),
        }
    }

    fn random_record(&mut self, lsn: Lsn) -> RedoRecord {
        // Pages 0 and 1 are hot: they collect long chains of records.
        let page = if self.rng.chance(0.4) { self.rng.below(2) } else { self.rng.below(WRITTEN_PAGES) };
        let payload = if self.rng.chance(0.12) {
            Payload::Image(self.rng.bytes(PAGE_SIZE))
        } else {
            // Ranges of one byte or more, as a writer's checked records have.
            let ranges = (0..1 + self.rng.below(3))
                .map(|_| {
                    let offset = self.rng.below(PAGE_SIZE as u64);
                    let len = 1 + self.rng.below((PAGE_SIZE as u64 - offset).min(40));
                    (offset as u32, self.rng.bytes(len as usize))
                })
                .collect();
            Payload::Ranges(ranges)
        };
        RedoRecord { lsn, page, payload }
    }

    fn batch(&mut self) -> Step {
        let mut lsn = self.complete;
        let mut records = Vec::new();
        for _ in 0..self.rng.below(5) {
            lsn = Lsn(lsn.0 + 1 + self.rng.below(3));
            records.push(Arc::new(self.random_record(lsn)));
        }
        let end = Lsn(lsn.0 + self.rng.below(3));
        // The owner makes the batch durable in the log before the index hears of it.
        let batch = RedoBatch {
            volume: VOLUME,
            epoch: WriterEpoch(1),
            prev_lsn: self.complete,
            end_lsn: end,
            records: records.iter().map(|r| RedoRecord::clone(r)).collect(),
        };
        self.log.append(&batch).map_err(|e| format!("the log refused a good batch: {e}"))?;
        self.versions.records_durable(records.clone(), end).map_err(|e| format!("a good batch refused: {e}"))?;
        for record in &records {
            self.model.record(record);
        }
        self.complete = end;
        self.durable = self.durable.max(end);
        self.check_watermarks()
    }

    /// A batch with one record past its page: refused whole, nothing changes.
    fn bad_batch(&mut self) -> Step {
        let good = self.random_record(Lsn(self.complete.0 + 1));
        let bad = RedoRecord {
            lsn: Lsn(self.complete.0 + 2),
            page: good.page,
            payload: Payload::Ranges(vec![(PAGE_SIZE as u32 - 2, vec![1, 2, 3])]),
        };
        let before = (self.versions.cached_records(), self.versions.records(good.page).len());
        if self.versions.records_durable(vec![Arc::new(good.clone()), Arc::new(bad)], Lsn(self.complete.0 + 2)).is_ok()
        {
            return Err("a batch with a range past its page was accepted".into());
        }
        if before != (self.versions.cached_records(), self.versions.records(good.page).len()) {
            return Err("a refused batch left records behind".into());
        }
        self.check_watermarks()
    }

    /// The stream is durable further than the records handed over (a recovery's view).
    fn durable_ahead(&mut self) -> Step {
        self.durable = Lsn(self.durable.0 + self.rng.below(4));
        self.versions.durable(self.durable);
        self.check_watermarks()
    }

    fn move_lsn_min(&mut self) -> Step {
        let to = if self.rng.chance(0.15) {
            Lsn(self.lsn_min.0.saturating_sub(1 + self.rng.below(5)))
        } else {
            Lsn(self.lsn_min.0 + self.rng.below(self.durable.0 - self.lsn_min.0 + 1))
        };
        self.versions.set_lsn_min(to);
        self.lsn_min = self.lsn_min.max(to);
        self.check_watermarks()
    }

    fn check_watermarks(&self) -> Step {
        let got = (self.versions.complete_lsn(), self.versions.durable_lsn(), self.versions.lsn_min());
        if got != (self.complete, self.durable, self.lsn_min) {
            return Err(format!(
                "watermarks (complete, durable, LSN_min) {got:?}, the model has {:?}",
                (self.complete, self.durable, self.lsn_min)
            ));
        }
        Ok(())
    }

    /// Materializes a few candidates into the store as a runtime would: the stored image plus
    /// the task's records, checked against the model; the report goes to the index at once
    /// or later.
    fn fold(&mut self) -> Step {
        let bound = self.lsn_min.min(self.durable);
        for task in self.versions.fold_candidates(1 + self.rng.below(4) as usize) {
            if self.check_fold_bound && task.through_lsn > bound {
                return Err(format!(
                    "page {} folded to {}, above min(LSN_min, durable) = {bound}",
                    task.page, task.through_lsn
                ));
            }
            let fetched = match &task.spilled {
                Some(read) => {
                    self.seen.folds_through_spilled += 1;
                    self.fetch(read).map_err(|e| format!("fold of page {}: {e}", task.page))?
                }
                None => Vec::new(),
            };
            let stored = self.store.get(&task.page);
            let base = stored.map(|(lsn, bytes)| (*lsn, &bytes[..]));
            let image = task
                .rebuild(base, &fetched, PAGE_SIZE)
                .map_err(|e| format!("fold of page {} to {}: {e}", task.page, task.through_lsn))?;
            let (changed, expected) = self.model.at(task.page, task.through_lsn);
            if image != expected || changed != task.through_lsn {
                return Err(format!("page {} folded to {} differs from the model", task.page, task.through_lsn));
            }
            self.store.insert(task.page, (task.through_lsn, image));
            self.seen.folds += 1;
            if self.rng.chance(0.3) {
                self.unreported.push((task.page, task.through_lsn));
            } else {
                self.report_materialized(task.page, task.through_lsn)?;
            }
        }
        // The stream is needed only past what every page's image holds (D6): truncate there, so
        // a record the index stopped counting too early is gone from the log.
        if self.rng.chance(0.5) {
            let through = self.versions.materialized_through();
            self.log.truncate_through(through).map_err(|e| format!("truncating the log through {through}: {e}"))?;
        }
        Ok(())
    }

    fn report_late(&mut self) -> Step {
        if !self.unreported.is_empty() {
            let (page, lsn) = self.unreported.swap_remove(self.rng.below(self.unreported.len() as u64) as usize);
            self.report_materialized(page, lsn)?;
            self.seen.late_reports += 1;
        }
        Ok(())
    }

    /// Tells the index, and cleans the page's slot as it answers; one time in two the cleaning
    /// is skipped, as a lazy owner may. The stale records are harmless to reads but take room
    /// the index does not know of, so merges overflow: a diligent owner's merges never do,
    /// since the index only asks for what it knows fits.
    fn report_materialized(&mut self, page: u64, lsn: Lsn) -> Step {
        let cleanup = self.versions.materialized(page, lsn);
        if self.rng.chance(0.5) {
            return Ok(());
        }
        let done = match cleanup {
            SlotCleanup::Keep => Ok(()),
            SlotCleanup::Clear => self.slots.clear(page),
            SlotCleanup::ClearThrough(lsn) => self.slots.clear_through(page, lsn).map(|_| ()),
        };
        done.map_err(|e| format!("cleaning page {page}'s slot ({cleanup:?}): {e}"))
    }

    /// Moves records out of memory toward a random bound, as the owner does when the cache
    /// passes its own: each task merged into its slot (or, slots off, left to the log) and
    /// reported; the cache's byte count must fall by exactly what left.
    fn spill(&mut self) -> Step {
        let cached = self.versions.cached_bytes();
        let bound = cached * self.rng.below(4) / 4;
        let mut expected = cached;
        for task in self.versions.spill_candidates(bound) {
            let in_memory = self.versions.records(task.page);
            if in_memory.len() < task.records.len() || in_memory[..task.records.len()] != task.records[..] {
                return Err(format!("page {}: a spill task that is not its oldest records in memory", task.page));
            }
            let merged = match self.spill_to {
                SpillTo::Slots => self.slots.merge(task.page, &task.records).map_err(|e| format!("merge: {e}"))?,
                SpillTo::Log => Merge::Merged { records: 0, bytes: 0 },
            };
            match merged {
                Merge::Merged { .. } => {
                    self.versions.spilled(task.page, task.through_lsn);
                    expected -= task.records.iter().map(|r| record_cost_bytes(r)).sum::<u64>();
                    self.seen.spills += 1;
                }
                Merge::Overflow { .. } => {
                    self.versions.slot_full(task.page);
                    self.seen.overflows += 1;
                }
            }
        }
        if self.versions.cached_bytes() != expected {
            return Err(format!(
                "the cache holds {} bytes after spilling, not {expected}",
                self.versions.cached_bytes()
            ));
        }
        Ok(())
    }

    /// The records a spilled read names, as the owner fetches them: the slot (which must pass
    /// its checks here: nothing damages it) or the log ranges.
    fn fetch(&self, read: &SpillRead) -> Result<Vec<crate::RedoRecord>, String> {
        let fetched = fetch(read, Some(&self.slots), &self.log).map_err(|e| format!("fetching {read:?}: {e}"))?;
        if let Some(error) = fetched.slot_error {
            return Err(format!("page {}'s slot: {error}", read.page()));
        }
        Ok(fetched.records)
    }

    fn random_request(&mut self) -> GetPage {
        // Half the reads are at or above LSN_min, where live readers read.
        let request_lsn = match self.rng.below(40) {
            0 => Lsn(0),
            1 => Lsn(u64::MAX),
            2..=20 => Lsn(self.lsn_min.0.max(1) + self.rng.below(self.complete.0.saturating_sub(self.lsn_min.0) + 3)),
            _ => Lsn(1 + self.rng.below(self.complete.0 + 3)),
        };
        let not_modified_since = match self.rng.below(10) {
            0..=3 => Lsn(0),
            4..=6 => Lsn(self.rng.below(request_lsn.0.min(self.complete.0 + 3) + 1)),
            7 => Lsn(request_lsn.0.saturating_add(1 + self.rng.below(2))),
            _ => request_lsn,
        };
        GetPage { request_lsn, not_modified_since }
    }

    fn read(&mut self) -> Step {
        let request = self.random_request();
        let page = self.rng.below(VOLUME_PAGES + 1);
        let stored = self.store.get(&page).map(|(lsn, _)| *lsn);
        let decision = self.versions.get_page(page, stored, request);
        if page >= VOLUME_PAGES {
            return match decision {
                Decision::BadRequest { .. } => Ok(()),
                other => Err(format!("a read of page {page}, outside the volume: {other:?}")),
            };
        }
        let expected = self.request_refusal(request);
        let at_lsn = request.request_lsn.min(self.complete);
        match expected {
            Some(refusal) if refusal == decision => Ok(()),
            Some(refusal) => Err(format!("page {page} {request:?}: {decision:?}, the model says {refusal:?}")),
            None => self.check_page(page, request, at_lsn, &decision),
        }
    }

    fn read_many(&mut self) -> Step {
        let request = self.random_request();
        let pages: Vec<(u64, Option<Lsn>)> = (0..1 + self.rng.below(5))
            .map(|_| self.rng.below(VOLUME_PAGES))
            .map(|page| (page, self.store.get(&page).map(|(lsn, _)| *lsn)))
            .collect();
        match (self.versions.get_pages(&pages, request), self.request_refusal(request)) {
            (Err(got), Some(refusal)) if got == refusal => Ok(()),
            (Ok((at_lsn, decisions)), None) => {
                if at_lsn != request.request_lsn.min(self.complete) || decisions.len() != pages.len() {
                    return Err(format!("{request:?}: a vectored read at {at_lsn} of {} pages", decisions.len()));
                }
                for (&(page, _), decision) in pages.iter().zip(&decisions) {
                    self.check_page(page, request, at_lsn, decision)?;
                }
                Ok(())
            }
            (got, refusal) => Err(format!("vectored {request:?}: {got:?}, the model says {refusal:?}")),
        }
    }

    /// The refusal of the whole request the model expects, if any.
    fn request_refusal(&mut self, request: GetPage) -> Option<Decision> {
        let refusal = if request.request_lsn == Lsn(0) {
            Some(Decision::BadRequest { reason: "a read at LSN 0" })
        } else if request.request_lsn < request.not_modified_since {
            Some(Decision::BadRequest { reason: "request_lsn is below not_modified_since" })
        } else if request.not_modified_since > self.complete {
            Some(Decision::NotYet { complete_lsn: self.complete })
        } else {
            None
        };
        match refusal {
            Some(Decision::NotYet { .. }) => self.seen.not_yet += 1,
            Some(_) => self.seen.bad_request += 1,
            None => {}
        }
        refusal
    }

    /// One page's answer against the model: `TooOld` exactly when the read is below LSN_min
    /// and the page changed since; otherwise the model's version at the read point.
    fn check_page(&mut self, page: u64, request: GetPage, at_lsn: Lsn, decision: &Decision) -> Step {
        let too_old = request.request_lsn < self.lsn_min && self.model.last_change(page) > request.request_lsn;
        let context = format!("page {page} {request:?} (complete {}, LSN_min {})", self.complete, self.lsn_min);
        let (served_at, page_lsn, plan) = match decision {
            Decision::TooOld { lsn_min } if too_old && *lsn_min == self.lsn_min => {
                self.seen.too_old += 1;
                return Ok(());
            }
            Decision::Serve { at_lsn, page_lsn, plan } if !too_old => (*at_lsn, *page_lsn, plan),
            other => return Err(format!("{context}: {other:?}, the model says too old: {too_old}")),
        };
        let (changed, expected) = self.model.at(page, at_lsn);
        if served_at != at_lsn || page_lsn != changed {
            return Err(format!(
                "{context}: served at {served_at} with page LSN {page_lsn}, the model: {at_lsn}, {changed}"
            ));
        }
        let stored = self.store.get(&page);
        if plan.image_lsn.is_some() && plan.image_lsn != stored.map(|(lsn, _)| *lsn) {
            return Err(format!("{context}: a plan from an image at {:?} the store does not hold", plan.image_lsn));
        }
        if self.spill_to == SpillTo::Slots && plan.device_reads() > 2 {
            return Err(format!("{context}: a plan of {} device reads with slots on", plan.device_reads()));
        }
        let fetched = match &plan.spilled {
            Some(read) => {
                match read {
                    SpillRead::Slot { .. } => self.seen.served_from_slot += 1,
                    SpillRead::Log { .. } => self.seen.served_from_log += 1,
                }
                self.fetch(read).map_err(|e| format!("{context}: {e}"))?
            }
            None => Vec::new(),
        };
        let bytes = plan
            .rebuild_with(stored.map(|(_, bytes)| &bytes[..]), &fetched, PAGE_SIZE)
            .map_err(|e| format!("{context}: rebuild: {e}"))?;
        if bytes != expected {
            return Err(format!("{context}: the page served differs from the model's version at {at_lsn}"));
        }
        self.seen.served += 1;
        if request.request_lsn < self.lsn_min {
            self.seen.served_below_lsn_min += 1;
        }
        if plan.image_lsn.is_none() && plan.records.first().is_some_and(|r| r.will_init()) {
            self.seen.served_from_will_init += 1;
        }
        Ok(())
    }
}

/// One seeded run of `steps` steps: `Err` names the step and what differed.
fn run(seed: u64, steps: usize) -> Result<Seen, String> {
    run_world(World::new(seed), steps)
}

fn run_world(mut world: World, steps: usize) -> Result<Seen, String> {
    let seed = world.seed;
    for step in 0..steps {
        world.step().map_err(|e| format!("seed {seed}, step {step}: {e}"))?;
    }
    Ok(world.seen)
}

fn runs() -> u64 {
    std::env::var("TUNDRA_MODEL_RUNS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(20)
}

#[test]
fn every_read_matches_the_model_of_all_versions() {
    let seed = seed_from_env(0x5e55_1013);
    let mut total = Seen::default();
    for run_index in 0..runs() {
        let seen = run(seed + run_index, STEPS)
            .unwrap_or_else(|e| panic!("{e} (replay with TUNDRA_SEED={} TUNDRA_MODEL_RUNS=1)", seed + run_index));
        total.add(&seen);
    }
    eprintln!("{total:?}");
    // Every rule was reached, so the agreement above means something.
    let counts = [
        total.served,
        total.served_below_lsn_min,
        total.served_from_will_init,
        total.too_old,
        total.not_yet,
        total.bad_request,
        total.folds,
        total.late_reports,
        total.spills,
        total.overflows,
        total.served_from_slot,
        total.served_from_log,
        total.folds_through_spilled,
    ];
    assert!(counts.iter().all(|&n| n > 0), "a rule never reached: {total:?}");
}

/// Runs the model on the default seeds with `bug` injected and returns the first failure.
fn failure_with(bug: Bug) -> String {
    let _bug = inject(bug);
    let failure = (0..20).find_map(|seed| run(seed, STEPS).err()).unwrap_or_else(|| panic!("{bug:?} went unnoticed"));
    eprintln!("{bug:?}: {failure}");
    failure
}

#[test]
fn the_model_fails_when_records_past_the_lsn_are_applied() {
    let failure = failure_with(Bug::ApplyPastLsn);
    let noticed = ["differs from the model", "page LSN", "the model says too old"];
    assert!(noticed.iter().any(|what| failure.contains(what)), "{failure}");
}

#[test]
fn the_model_fails_when_folding_passes_lsn_min() {
    let failure = failure_with(Bug::FoldAboveLsnMin);
    assert!(failure.contains("above min(LSN_min, durable)"), "{failure}");
    // Without the harness's own look at fold tasks, reads notice: a version a reader may ask
    // for is gone, and the read is refused as too old (never served from the newer image).
    let _bug = inject(Bug::FoldAboveLsnMin);
    let failure = (0..20)
        .find_map(|seed| run_world(World { check_fold_bound: false, ..World::new(seed) }, STEPS).err())
        .expect("reads noticed nothing");
    eprintln!("FoldAboveLsnMin, reads alone: {failure}");
    assert!(failure.contains("TooOld") && failure.contains("too old: false"), "{failure}");
}

#[test]
fn the_model_fails_when_a_read_below_the_horizon_gets_a_newer_page() {
    let failure = failure_with(Bug::ServeAnyImage);
    assert!(failure.contains("the model says too old: true"), "{failure}");
}

#[test]
fn the_model_fails_when_spilled_records_are_forgotten() {
    let failure = failure_with(Bug::SpillForgetsRecords);
    let noticed = ["differs from the model", "page LSN", "the model says too old"];
    assert!(noticed.iter().any(|what| failure.contains(what)), "{failure}");
}

#[test]
fn the_model_fails_when_the_log_is_truncated_past_spilled_records() {
    let failure = failure_with(Bug::TruncatePastSpilled);
    assert!(failure.contains("truncated"), "{failure}");
}
