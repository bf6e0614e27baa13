//! The node's side of journal damage: each store's journal named by where it lives (so a
//! message says "the compressed store's journal in fast.img" and an LBA of that file), its
//! recovery notes passed to the open's progress, and a read-only look at both journals for
//! `tundra repair` without `--accept-loss`. A node with replicas will repair from its peers
//! instead; until then a repair accepts the loss it reports.

use std::path::Path;
use std::sync::Arc;

use tundra_device::file::FileDevice;
use tundra_device::slice::SliceDevice;
use tundra_device::{BlockDevice, Lba};
use tundra_store::journal::{JournalPlace, LogDamage};
use tundra_store::store::{OpenOptions, Store};

use crate::layout::{self, FAST_FILE, FastSlices};
use crate::{Device, Result};

/// The places of the compressed store's journal and the uncompressed store's, in fast.img.
pub(crate) fn journal_places(slices: &FastSlices) -> [JournalPlace; 2] {
    [
        JournalPlace {
            name: format!("the compressed store's journal in {FAST_FILE}"),
            first_lba: Lba(slices.data_journal.0),
        },
        JournalPlace {
            name: format!("the uncompressed store's journal in {FAST_FILE}"),
            first_lba: Lba(slices.fast_journal.0),
        },
    ]
}

/// Opens one store, telling `progress` of every damage its recovery dealt with.
pub(crate) fn open_store(
    data: Arc<dyn BlockDevice>,
    journal: Arc<dyn BlockDevice>,
    place: JournalPlace,
    accept_loss: bool,
    progress: &mut dyn FnMut(&str),
) -> Result<Store> {
    let store = Store::open_with(data, journal, &OpenOptions { place, accept_loss })?;
    for note in &store.recovery().notes {
        progress(note);
    }
    Ok(store)
}

/// What a read-only look at one store's journal found.
#[derive(Clone, Debug)]
pub struct JournalReport {
    pub device: Device,
    pub place: JournalPlace,
    /// Damage the next start recovers from without loss.
    pub notes: Vec<String>,
    /// Damage in the log: a start refuses, a repair drops the log from there.
    pub damage: Option<LogDamage>,
}

/// Looks at both journals of the stopped node in `dir` without changing anything.
pub fn inspect_journals(dir: &Path) -> Result<Vec<JournalReport>> {
    let layout = layout::read(dir)?;
    let fast: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(dir.join(FAST_FILE))?);
    let slices = layout.fast_slices();
    let places = journal_places(&slices);
    let mut reports = Vec::new();
    for ((device, (first, count)), place) in
        [(Device::Drive, slices.data_journal), (Device::Fast, slices.fast_journal)].into_iter().zip(places)
    {
        let journal = SliceDevice::new(fast.clone(), Lba(first), count)?;
        let found = tundra_store::journal::inspect(&journal, &place)?;
        reports.push(JournalReport { device, place, notes: found.notes, damage: found.damage });
    }
    Ok(reports)
}
