//! [`LocalStorage`]: storage for compute nodes built in process from tundra-redo's pieces, so
//! the database is whole and testable without a node. Per volume: a [`RedoLog`] on a
//! [`MemDevice`] makes batches durable (group commit, fencing, gaps, exactly as the node's
//! will); [`PageVersions`] holds the records not yet folded into pages and decides every read
//! (GetPage@LSN); [`Leases`] gives LSN_min; and a map of page images at their LSN stands in
//! for the compressed page store that folding writes into.
//!
//! Folding is eager by default: after every append, every page with records at or below
//! min(LSN_min, durable) is materialized, so the history a lagging reader needs survives only
//! because its lease holds LSN_min back, which is what the tests want to exercise. The log is
//! truncated once its records are all in images. Ingest can be held back by a number of
//! batches (`ingest_lag_batches`): the batches are durable but not yet handed to the page
//! versions, so the complete LSN trails the durable one as it does on a busy node; a read that
//! needs more waits for ingest to catch up, as the node's bounded wait does.
//!
//! What it leaves out: the page images live in memory only (a restart of the storage is not
//! modelled), and a read's lease is not checked (a read below LSN_min of a changed page is
//! refused as `TooOld` all the same).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use tundra_device::BlockDevice;
use tundra_device::mem::MemDevice;
use tundra_env::Env;
use tundra_redo::{
    AppendOutcome, Decision, GetPage, LeaseConfig, LeaseId, LeaseRefusal, Leases, LogGeometry, PageVersions, ReaderId,
    RedoBatch, RedoLog, reconstruct,
};
use tundra_store::ids::{Lsn, VolumeId};
use tundra_store::store::Watermarks;

use super::{PageStorage, ReadAt, ReaderLease, RedoStatus, Renewal, ServedPage, VolumeGeometry};
use crate::{Error, ErrorKind, Result};

/// How local storage behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalConfig {
    /// Blocks of each volume's redo log ring (4 KiB each).
    pub log_blocks: u64,
    pub lease: LeaseConfig,
    /// Durable batches kept from the page versions until this many newer ones arrive.
    pub ingest_lag_batches: usize,
    /// Records are folded into images once they cost more than this many bytes of memory;
    /// 0 folds after every append.
    pub fold_above_bytes: u64,
}

impl Default for LocalConfig {
    fn default() -> LocalConfig {
        LocalConfig { log_blocks: 4096, lease: LeaseConfig::default(), ingest_lag_batches: 0, fold_above_bytes: 0 }
    }
}

/// What a volume's storage did, for tests and reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LocalStats {
    pub batches: u64,
    pub records: u64,
    pub pages_folded: u64,
    pub reads: u64,
    pub too_old: u64,
    pub not_yet_waits: u64,
    pub truncations: u64,
    pub images: usize,
    pub cached_records: u64,
    pub lsn_min: Lsn,
    pub complete_lsn: Lsn,
    pub live_leases: usize,
}

struct LocalVolume {
    geometry: VolumeGeometry,
    log: RedoLog,
    versions: PageVersions,
    leases: Leases,
    /// The stand-in for the page store: each page's image and the LSN it is as of.
    images: HashMap<u64, (Lsn, Vec<u8>)>,
    /// Durable batches not yet handed to `versions`.
    unapplied: VecDeque<RedoBatch>,
    stats: LocalStats,
}

/// Storage in process; see the module's description.
pub struct LocalStorage {
    env: Env,
    config: LocalConfig,
    volumes: Mutex<BTreeMap<VolumeId, Arc<Mutex<LocalVolume>>>>,
}

impl LocalStorage {
    pub fn new(env: Env, config: LocalConfig) -> LocalStorage {
        LocalStorage { env, config, volumes: Mutex::new(BTreeMap::new()) }
    }

    /// Creates an empty volume with an empty redo stream at LSN 0.
    pub fn create_volume(&self, volume: VolumeId, geometry: VolumeGeometry) -> Result<()> {
        let mut volumes = self.volumes.lock();
        if volumes.contains_key(&volume) {
            return Err(Error::invalid(format!("volume {} exists already", volume.0)));
        }
        let page_size = u32::try_from(geometry.page_size).map_err(|_| Error::invalid("a page size above 4 GiB"))?;
        let log_geometry = LogGeometry { volume, page_size, log_blocks: self.config.log_blocks };
        let device = Arc::new(MemDevice::new(log_geometry.total_blocks()));
        RedoLog::format(device.as_ref(), log_geometry)?;
        let (log, _) = RedoLog::open(device as Arc<dyn BlockDevice>)?;
        let marks = Watermarks { durable_lsn: Lsn(0), min_reader_lsn: Lsn(0) };
        let volume_state = LocalVolume {
            geometry,
            log,
            versions: PageVersions::new(geometry.page_size, geometry.page_count, marks),
            leases: Leases::new(&self.env, self.config.lease, Lsn(0)),
            images: HashMap::new(),
            unapplied: VecDeque::new(),
            stats: LocalStats::default(),
        };
        volumes.insert(volume, Arc::new(Mutex::new(volume_state)));
        Ok(())
    }

    pub fn stats(&self, volume: VolumeId) -> Result<LocalStats> {
        let volume = self.volume(volume)?;
        let mut v = volume.lock();
        let live_leases = v.leases.live_count();
        Ok(LocalStats {
            images: v.images.len(),
            cached_records: v.versions.cached_records(),
            lsn_min: v.versions.lsn_min(),
            complete_lsn: v.versions.complete_lsn(),
            live_leases,
            ..v.stats
        })
    }

    /// Hands every durable batch to the page versions, as if the applier caught up.
    pub fn catch_up(&self, volume: VolumeId) -> Result<()> {
        let volume = self.volume(volume)?;
        let mut v = volume.lock();
        v.ingest(0)
    }

    fn volume(&self, volume: VolumeId) -> Result<Arc<Mutex<LocalVolume>>> {
        self.volumes
            .lock()
            .get(&volume)
            .cloned()
            .ok_or_else(|| Error::invalid(format!("no volume {} in this storage", volume.0)))
    }
}

impl LocalVolume {
    /// Hands durable batches to the page versions, keeping the newest `keep` back.
    fn ingest(&mut self, keep: usize) -> Result<()> {
        while self.unapplied.len() > keep {
            let batch = self.unapplied.pop_front().expect("more batches than kept");
            self.stats.records += batch.records.len() as u64;
            let records = batch.records.into_iter().map(Arc::new).collect();
            self.versions.records_durable(records, batch.end_lsn)?;
        }
        Ok(())
    }

    /// LSN_min from the leases to the page versions, then folding and truncation as due.
    fn maintain(&mut self, fold_above_bytes: u64) -> Result<()> {
        self.leases.durable(self.log.durable_lsn());
        let lsn_min = self.leases.lsn_min();
        self.versions.set_lsn_min(lsn_min);
        if self.versions.cached_bytes() > fold_above_bytes {
            self.fold()?;
        }
        let (used, total) = self.log.usage_blocks();
        let through = self.versions.materialized_through();
        if used * 2 > total && through > self.log.start_lsn() {
            self.log.truncate_through(through)?;
            self.stats.truncations += 1;
        }
        Ok(())
    }

    /// Materializes every page with records at or below the fold bound.
    fn fold(&mut self) -> Result<()> {
        let page_size = self.geometry.page_size;
        for task in self.versions.fold_candidates(usize::MAX) {
            let base = self.images.get(&task.page).map(|(lsn, bytes)| (*lsn, bytes.as_slice()));
            let image = reconstruct(base, &task.records, task.through_lsn, page_size)?;
            self.images.insert(task.page, (task.through_lsn, image));
            self.versions.materialized(task.page, task.through_lsn);
            self.stats.pages_folded += 1;
        }
        Ok(())
    }

    fn serve(&mut self, page: u64, at: ReadAt) -> Result<ServedPage> {
        let request = GetPage { request_lsn: at.request_lsn, not_modified_since: at.not_modified_since };
        if at.not_modified_since > self.versions.complete_lsn() {
            // The bounded wait of a node: here ingest catches up at once.
            self.stats.not_yet_waits += 1;
            self.ingest(0)?;
        }
        self.stats.reads += 1;
        let stored = self.images.get(&page).map(|(lsn, _)| *lsn);
        match self.versions.get_page(page, stored, request) {
            Decision::Serve { at_lsn, page_lsn, plan } => {
                let image = self.images.get(&page).map(|(_, bytes)| bytes.as_slice());
                let data = plan.rebuild(image, self.geometry.page_size)?;
                Ok(ServedPage { served_lsn: at_lsn, page_lsn, data })
            }
            Decision::TooOld { lsn_min } => {
                self.stats.too_old += 1;
                Err(Error::new(
                    ErrorKind::TooOld { lsn_min },
                    format!("page {page} at LSN {} is below LSN_min {lsn_min} and changed since", at.request_lsn),
                ))
            }
            Decision::NotYet { complete_lsn } => Err(Error::new(
                ErrorKind::NotYet { complete_lsn },
                format!("redo is complete to LSN {complete_lsn}, not {}", at.not_modified_since),
            )),
            Decision::BadRequest { reason } => Err(Error::invalid(format!("page {page}: {reason}"))),
        }
    }
}

fn lease_error(refusal: LeaseRefusal, lsn_min: Lsn) -> Error {
    let kind = match refusal {
        LeaseRefusal::TooOld { lsn_min, .. } => ErrorKind::TooOld { lsn_min },
        LeaseRefusal::Backwards { .. } => ErrorKind::Invalid,
        _ => ErrorKind::LeaseLost { lsn_min },
    };
    Error::new(kind, refusal.to_string())
}

impl PageStorage for LocalStorage {
    fn geometry(&self, volume: VolumeId) -> Result<VolumeGeometry> {
        Ok(self.volume(volume)?.lock().geometry)
    }

    fn append_redo(&self, batch: &RedoBatch) -> Result<AppendOutcome> {
        let volume = self.volume(batch.volume)?;
        let mut v = volume.lock();
        if let Some(record) = batch.records.iter().find(|r| r.page >= v.geometry.page_count) {
            return Err(Error::invalid(format!(
                "the record at LSN {} is for page {}, outside the volume's {} pages",
                record.lsn, record.page, v.geometry.page_count
            )));
        }
        let outcome = v.log.append(batch)?;
        if let AppendOutcome::Ok { .. } = outcome {
            v.stats.batches += 1;
            v.unapplied.push_back(batch.clone());
            v.ingest(self.config.ingest_lag_batches)?;
            v.maintain(self.config.fold_above_bytes)?;
        }
        Ok(outcome)
    }

    fn get_page(&self, volume: VolumeId, page: u64, at: ReadAt) -> Result<ServedPage> {
        let volume = self.volume(volume)?;
        let mut v = volume.lock();
        v.serve(page, at)
    }

    fn register_reader(&self, volume: VolumeId, reader: ReaderId, start_lsn: Lsn) -> Result<ReaderLease> {
        let volume = self.volume(volume)?;
        let mut v = volume.lock();
        let lsn_min = v.leases.lsn_min();
        let lease = v.leases.register(reader, start_lsn).map_err(|refusal| lease_error(refusal, lsn_min))?;
        let valid_for = v.leases.config().ttl;
        v.maintain(self.config.fold_above_bytes)?;
        Ok(ReaderLease { id: lease.id, granted_lsn: lease.granted_lsn, valid_for })
    }

    fn renew_reader(&self, volume: VolumeId, lease: LeaseId, apply_lsn: Lsn) -> Result<Renewal> {
        let volume = self.volume(volume)?;
        let mut v = volume.lock();
        let renewed = v.leases.renew(lease, apply_lsn);
        let lsn_min = v.leases.lsn_min();
        let renewed = renewed.map_err(|refusal| lease_error(refusal, lsn_min))?;
        v.maintain(self.config.fold_above_bytes)?;
        Ok(Renewal { valid_for: v.leases.config().ttl, lsn_min: renewed.lsn_min })
    }

    fn release_reader(&self, volume: VolumeId, lease: LeaseId) -> Result<()> {
        let volume = self.volume(volume)?;
        let mut v = volume.lock();
        v.leases.release(lease);
        v.maintain(self.config.fold_above_bytes)
    }

    fn redo_status(&self, volume: VolumeId) -> Result<RedoStatus> {
        let volume = self.volume(volume)?;
        let mut v = volume.lock();
        Ok(RedoStatus {
            writer_epoch: v.log.fence(),
            durable_lsn: v.log.durable_lsn(),
            complete_lsn: v.versions.complete_lsn(),
            lsn_min: v.leases.lsn_min(),
        })
    }
}
