//! Sections (seed 001 §3.3.3: "we partition one table space into multiple sections, each
//! section has its own PUT request queue and associates with one background thread that
//! processes the PUT request queue"): the table's buckets are split among sections by LBA; each
//! has a queue of durable records and a writer thread that takes everything queued, applies it
//! as one batch, and takes the next.
//!
//! Until its batch is applied, an acknowledged record is also in its section's pending map,
//! which lookups consult before the drive: a GET sees every acknowledged PUT. The map holds only
//! records in flight, never an index of the table, and its size is bounded by the log's ring.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use tundra_device::Lba;

use crate::apply::Applier;
use crate::layout::Key;
use crate::wal::{Logged, WalRecord};
use crate::{Error, ErrorKind, Result};

/// Records one writer applies at most as one batch.
const MAX_BATCH_RECORDS: usize = 512;

/// The first error that stopped the store's background work; every later write sees it.
#[derive(Default)]
pub struct Failure {
    first: Mutex<Option<(ErrorKind, String)>>,
}

impl Failure {
    pub fn set(&self, error: &Error) {
        self.first.lock().get_or_insert_with(|| (error.kind(), error.message().to_string()));
    }

    pub fn check(&self) -> Result<()> {
        match &*self.first.lock() {
            Some((kind, message)) => Err(Error::new(
                *kind,
                format!("the store stopped applying records ({message}); reopen it to replay the log"),
            )),
            None => Ok(()),
        }
    }
}

#[derive(Default)]
struct SectionState {
    queue: VecDeque<Logged>,
    /// The log block of the oldest record in the batch being applied.
    in_flight_oldest: Option<u64>,
    /// The newest acknowledged, not yet applied change per key, with its ticket.
    pending: HashMap<Key, (u64, Option<Vec<u8>>)>,
    stop: bool,
}

#[derive(Default)]
struct Section {
    state: Mutex<SectionState>,
    work: Condvar,
}

/// All sections, with what their writers share.
pub struct Sections {
    sections: Vec<Section>,
    applier: Arc<Applier>,
    failure: Arc<Failure>,
    /// Batches applied so far; waiters for progress watch it.
    progress: Mutex<u64>,
    progressed: Condvar,
}

impl Sections {
    pub fn new(count: usize, applier: Arc<Applier>, failure: Arc<Failure>) -> Sections {
        assert!(count > 0, "at least one section");
        Sections {
            sections: (0..count).map(|_| Section::default()).collect(),
            applier,
            failure,
            progress: Mutex::new(0),
            progressed: Condvar::new(),
        }
    }

    pub fn count(&self) -> usize {
        self.sections.len()
    }

    fn of(&self, lba: Lba) -> &Section {
        &self.sections[(lba.0 % self.sections.len() as u64) as usize]
    }

    /// Queues durable records on their sections and makes them visible to lookups.
    /// A group's records are split by section first, so each section is locked and its writer
    /// woken once per group, not once per record.
    pub fn dispatch(&self, records: Vec<Logged>) {
        let count = self.sections.len();
        let mut by_section: Vec<Vec<Logged>> = (0..count).map(|_| Vec::new()).collect();
        for logged in records {
            let lba = self.applier.layout.lba_of(&logged.record.key);
            by_section[(lba.0 % count as u64) as usize].push(logged);
        }
        for (section, records) in self.sections.iter().zip(by_section) {
            if records.is_empty() {
                continue;
            }
            let mut state = section.state.lock();
            for logged in records {
                state.pending.insert(logged.record.key, (logged.ticket, logged.record.value.clone()));
                state.queue.push_back(logged);
            }
            drop(state);
            section.work.notify_one();
        }
    }

    /// The pending change of `key`, if one is in flight: `Some(None)` is a pending delete.
    pub fn pending(&self, lba: Lba, key: &Key) -> Option<Option<Vec<u8>>> {
        self.of(lba).state.lock().pending.get(key).map(|(_, value)| value.clone())
    }

    /// Records acknowledged and not yet applied.
    pub fn pending_count(&self) -> usize {
        self.sections.iter().map(|s| s.state.lock().pending.len()).sum()
    }

    /// The log block of the oldest record not yet applied, if any.
    pub fn oldest_unapplied(&self) -> Option<u64> {
        self.sections
            .iter()
            .filter_map(|s| {
                let state = s.state.lock();
                let queued = state.queue.front().map(|l| l.log_block);
                [state.in_flight_oldest, queued].into_iter().flatten().min()
            })
            .min()
    }

    /// Waits until a batch is applied or `timeout` passes. Callers re-check their condition
    /// after it returns, so a wake-up missed before the wait only costs the timeout.
    pub fn wait_for_progress(&self, timeout: Duration) {
        let mut progress = self.progress.lock();
        self.progressed.wait_for(&mut progress, timeout);
    }

    /// Returns once every queued record is applied, or with the error that stopped a writer.
    pub fn drain(&self) -> Result<()> {
        loop {
            self.failure.check()?;
            let busy = self.sections.iter().any(|s| {
                let state = s.state.lock();
                !state.queue.is_empty() || state.in_flight_oldest.is_some()
            });
            if !busy {
                return Ok(());
            }
            self.wait_for_progress(Duration::from_millis(10));
        }
    }

    /// Asks every writer to stop once its queue is empty (or at its first error).
    pub fn stop(&self) {
        for section in &self.sections {
            section.state.lock().stop = true;
            section.work.notify_all();
        }
    }

    /// The writer thread of section `index`: batches until stopped or failed.
    pub fn run_writer(&self, index: usize) {
        let section = &self.sections[index];
        loop {
            let batch: Vec<Logged> = {
                let mut state = section.state.lock();
                while state.queue.is_empty() && !state.stop {
                    section.work.wait(&mut state);
                }
                if state.queue.is_empty() {
                    return;
                }
                let take = state.queue.len().min(MAX_BATCH_RECORDS);
                let batch: Vec<Logged> = state.queue.drain(..take).collect();
                state.in_flight_oldest = Some(batch[0].log_block);
                batch
            };
            let records: Vec<&WalRecord> = batch.iter().map(|l| &l.record).collect();
            if let Err(error) = self.applier.apply(&records) {
                // The records stay pending (lookups still see them) and in the log, which
                // the next open replays; the oldest stays marked, so no checkpoint passes it.
                self.failure.set(&error);
                self.progressed.notify_all();
                return;
            }
            {
                let mut state = section.state.lock();
                for logged in &batch {
                    if state.pending.get(&logged.record.key).is_some_and(|(t, _)| *t == logged.ticket) {
                        state.pending.remove(&logged.record.key);
                    }
                }
                state.in_flight_oldest = None;
            }
            *self.progress.lock() += 1;
            self.progressed.notify_all();
        }
    }
}
