//! The node's redo streams (seed 000 §2.1, §3.3.1): a volume whose writer sends redo gets one
//! of the redo area's streams at the end of the fast device, never compressed. The streams'
//! owners are kept in a two-copy directory at the area's start, so a restart finds every
//! stream and the volume it belongs to.
//!
//! Per stream the node keeps the durable log (`tundra_redo::RedoLog`), the page versions not
//! yet folded into the store (`PageVersions`), the reader leases (`Leases`) and the per-page
//! log slots (`SlotArea`, Opt#3 of seed 000 §3.3.3) in the stream's region of the drive's
//! logical space, after the store's. `io.rs` serves appends, reads at an LSN and leases;
//! `fold.rs` materializes pages through the compressed page path, never above
//! min(LSN_min, durable), and truncates the log behind them; `spill.rs` moves records out of
//! memory into their pages' slots when the stream's cache passes its bound.
//!
//! A stream is created by the volume's first AppendRedo and lives as long as the volume.

mod directory;
mod fold;
mod image;
mod io;
mod spill;

pub use fold::FOLD_PAGES_PER_PASS;
pub use fold::FoldBug;
pub use image::{CopyBug, CopyHead};
pub use io::{LeaseGrant, NOT_YET_WAIT, RedoRefusal, RedoWatermarks, ServedPage};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Condvar, Mutex, RwLock};
use tundra_device::slice::SliceDevice;
use tundra_device::{BlockDevice, Lba};
use tundra_env::Env;
use tundra_redo::{LeaseConfig, Leases, LogGeometry, PageVersions, RedoLog, SlotArea, SpillTo};
use tundra_store::ids::{ChunkId, Lsn, PageNo, VolumeId};
use tundra_store::store::Watermarks;

use crate::layout::{Layout, REDO_DIRECTORY_BLOCKS};
use crate::node::VolumeRef;
use crate::{Error, Result};
use directory::Directory;

/// One volume's redo stream.
pub(crate) struct Stream {
    pub volume: VolumeId,
    pub slot: u32,
    pub log: RedoLog,
    pub state: Mutex<StreamState>,
    /// Signalled when the complete LSN moves, for reads waiting on `NotYet`.
    pub advanced: Condvar,
    /// Reads hold it shared from their decision to their image and slot reads; a fold holds
    /// it exclusively from its image write to telling the versions and cleaning the slot, so a
    /// read never pairs a plan with an image newer than the plan expects, nor finds the
    /// records its plan names gone from the slot.
    pub fold_gate: RwLock<()>,
    /// The page's log slots; `None` with slots off (or a layout without them): records that
    /// leave memory are then read back from the log.
    pub slots: Option<SlotArea>,
    /// Held by a fold pass and a spill pass for their whole run, so the two never interleave
    /// on a slot: a spill's merge never lands behind a fold's cleanup of the same records.
    pub upkeep: Mutex<()>,
    pub counters: StreamCounters,
}

impl Stream {
    /// The stream's page versions take the pages `volume` gained since they were sized (a
    /// resize; volumes never shrink): a record or a read of a new page is then checked against
    /// the volume's size alone, and a batch is never refused by the versions after its log
    /// made it durable. `volume` is the store's view, which grows before anyone can name a
    /// new page.
    pub(crate) fn fit_to(&self, volume: &VolumeRef) {
        let pages = volume.volume.page_count();
        let mut state = self.state.lock();
        if state.versions.page_count() < pages {
            state.versions.grow(pages);
        }
    }
}

/// What a stream's reads and spills did since the node opened it.
#[derive(Default)]
pub(crate) struct StreamCounters {
    /// Reads served that applied at least one record (a page rebuilt, not just an image).
    pub rebuilt_pages: AtomicU64,
    /// Device reads those rebuilds took: images, slots and redo log batches.
    pub rebuild_device_reads: AtomicU64,
    /// Records moved out of memory (into slots, or left to the log).
    pub spilled_records: AtomicU64,
    /// Times a page's slot had no room for the page's records in memory (a merge overflowed,
    /// or was not even tried): the page is then folded, or gets an extra image.
    pub slot_overflows: AtomicU64,
    /// Extra images written above LSN_min for pages whose slots would overflow.
    pub extra_images: AtomicU64,
}

impl StreamCounters {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

pub(crate) struct StreamState {
    pub versions: PageVersions,
    pub leases: Leases,
}

/// The redo area and its streams.
pub(crate) struct Redo {
    area: Option<Area>,
    streams: RwLock<BTreeMap<VolumeId, Arc<Stream>>>,
    env: Env,
    lease_config: LeaseConfig,
    options: RedoOptions,
}

/// How the node runs its streams (`[redo]` in the configuration).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RedoOptions {
    /// Record bytes a stream keeps in memory before the oldest spill.
    pub cache_bytes: u64,
    pub log_slots: bool,
}

impl RedoOptions {
    pub fn of(config: &crate::Config) -> Result<RedoOptions> {
        Ok(RedoOptions { cache_bytes: config.redo.cache_bytes()?, log_slots: config.redo.log_slots })
    }
}

/// Where the streams' log slots live: regions of the drive after the store's blocks.
struct SlotRegions {
    drive: Arc<dyn BlockDevice>,
    /// (first block, blocks) of stream `i`'s region is `layout.slot_region(i)`.
    layout: Layout,
}

struct Area {
    device: Arc<dyn BlockDevice>,
    stream_blocks: u64,
    directory: Mutex<Directory>,
    slots: Option<SlotRegions>,
}

impl Redo {
    /// No area and no stream: a node before its streams are recovered.
    pub fn empty(env: &Env, options: RedoOptions) -> Redo {
        Redo {
            area: None,
            streams: RwLock::new(BTreeMap::new()),
            env: env.clone(),
            lease_config: LeaseConfig::default(),
            options,
        }
    }

    pub fn options(&self) -> RedoOptions {
        self.options
    }

    /// The redo area of `layout` on the fast device, its directory read and every stream whose
    /// volume still exists recovered: the durable records the store's images do not hold yet
    /// are back in memory. `volumes` are the node's volumes; `drive` holds the log slots
    /// after the store's blocks, if the layout has them.
    pub fn open(
        layout: &Layout,
        fast: &Arc<dyn BlockDevice>,
        drive: Arc<dyn BlockDevice>,
        env: &Env,
        options: RedoOptions,
        volumes: &BTreeMap<VolumeId, VolumeRef>,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Redo> {
        let (first, count) = layout.fast_slices().redo;
        let mut redo = Redo::empty(env, options);
        if layout.redo_streams == 0 {
            return Ok(redo);
        }
        let device: Arc<dyn BlockDevice> = Arc::new(SliceDevice::new(fast.clone(), Lba(first), count)?);
        let directory = Directory::read(device.as_ref(), layout.redo_streams)?;
        let slots =
            (options.log_slots && layout.redo_slot_blocks > 0).then(|| SlotRegions { drive, layout: layout.clone() });
        let area = Area { device, stream_blocks: layout.redo_stream_blocks, directory: Mutex::new(directory), slots };
        let mut streams = BTreeMap::new();
        let owners: Vec<(u32, VolumeId)> = area.directory.lock().owners();
        for (slot, volume_id) in owners {
            let Some(volume) = volumes.get(&volume_id) else {
                // The volume was deleted after its stream was made: the slot is free again.
                area.directory.lock().set(area.device.as_ref(), slot, None)?;
                continue;
            };
            let stream = redo.recover_stream(&area, slot, volume)?;
            progress(&format!(
                "redo stream of volume {:?}: durable through LSN {}, {} record bytes to fold",
                volume.volume.name,
                stream.log.durable_lsn(),
                stream.state.lock().versions.cached_bytes()
            ));
            streams.insert(volume_id, Arc::new(stream));
        }
        redo.area = Some(area);
        redo.streams = RwLock::new(streams);
        Ok(redo)
    }

    fn stream_device(&self, area: &Area, slot: u32) -> Result<Arc<dyn BlockDevice>> {
        let first = REDO_DIRECTORY_BLOCKS + u64::from(slot) * area.stream_blocks;
        Ok(Arc::new(SliceDevice::new(area.device.clone(), Lba(first), area.stream_blocks)?))
    }

    /// Opens a stream's log and puts back in memory every durable record above the LSN of
    /// its page's image in the store.
    fn recover_stream(&self, area: &Area, slot: u32, volume: &VolumeRef) -> Result<Stream> {
        let (log, recovered) = RedoLog::open(self.stream_device(area, slot)?).map_err(redo_error)?;
        if log.geometry().volume != volume.volume.id {
            return Err(Error::Corrupted(format!(
                "redo stream {slot} holds the log of volume id {}, but the directory names volume {:?} (id {})",
                log.geometry().volume.0,
                volume.volume.name,
                volume.volume.id.0
            )));
        }
        let slots = match &area.slots {
            Some(regions) => {
                let (first, count) = regions.layout.slot_region(slot);
                let slots = SlotArea::new(regions.drive.clone(), Lba(first), count, volume.volume.page_size)
                    .map_err(redo_error)?;
                // The index is rebuilt from the log below; what the slots held before is stale.
                slots.clear_all().map_err(redo_error)?;
                Some(slots)
            }
            None => None,
        };
        let spill_to = if slots.is_some() { SpillTo::Slots } else { SpillTo::Log };
        let marks = Watermarks { durable_lsn: recovered.start_lsn, min_reader_lsn: recovered.start_lsn };
        let mut versions =
            PageVersions::new(volume.page_size(), volume.volume.page_count(), marks).spilling_to(spill_to);
        for batch in log.read_after(recovered.start_lsn).map_err(redo_error)? {
            let batch = batch.map_err(redo_error)?;
            let mut records = Vec::with_capacity(batch.records.len());
            for record in batch.records {
                let stored = image_lsn(volume, record.page)?;
                if stored.is_none_or(|lsn| record.lsn > lsn) {
                    records.push(Arc::new(record));
                }
            }
            versions.records_durable(records, batch.end_lsn).map_err(redo_error)?;
        }
        versions.durable(recovered.durable_lsn);
        let mut leases = Leases::new(&self.env, self.lease_config, recovered.durable_lsn);
        versions.set_lsn_min(leases.lsn_min());
        Ok(Stream {
            volume: volume.volume.id,
            slot,
            log,
            state: Mutex::new(StreamState { versions, leases }),
            advanced: Condvar::new(),
            fold_gate: RwLock::new(()),
            slots,
            upkeep: Mutex::new(()),
            counters: StreamCounters::default(),
        })
    }

    /// The stream of a volume, if it has one.
    pub fn stream(&self, volume: VolumeId) -> Option<Arc<Stream>> {
        self.streams.read().get(&volume).cloned()
    }

    /// Every stream, in volume order.
    pub fn streams(&self) -> Vec<Arc<Stream>> {
        self.streams.read().values().cloned().collect()
    }

    /// The volume's stream, made on a free slot of the area if it has none.
    pub fn stream_or_create(&self, volume: &VolumeRef) -> Result<Arc<Stream>> {
        if let Some(stream) = self.stream(volume.volume.id) {
            return Ok(stream);
        }
        let Some(area) = &self.area else {
            return Err(Error::Invalid(format!(
                "volume {:?} cannot take redo: this data directory was set up before redo streams existed; \
                 set up a new one",
                volume.volume.name
            )));
        };
        let mut streams = self.streams.write();
        if let Some(stream) = streams.get(&volume.volume.id) {
            return Ok(stream.clone());
        }
        let mut directory = area.directory.lock();
        let Some(slot) = directory.free_slot() else {
            return Err(Error::NoSpace(format!(
                "every one of the node's {} redo streams is taken; delete a volume that has one",
                directory.slots()
            )));
        };
        let device = self.stream_device(area, slot)?;
        let geometry = LogGeometry {
            volume: volume.volume.id,
            page_size: volume.volume.page_size,
            log_blocks: area.stream_blocks - 2,
        };
        RedoLog::format(device.as_ref(), geometry).map_err(redo_error)?;
        // The slot is named after its log is formatted: a crash in between leaves a free slot.
        directory.set(area.device.as_ref(), slot, Some(volume.volume.id))?;
        let stream = self.recover_stream(area, slot, volume)?;
        let stream = Arc::new(stream);
        streams.insert(volume.volume.id, stream.clone());
        Ok(stream)
    }

    /// A deleted volume's stream is dropped and its slot freed.
    pub fn forget(&self, volume: VolumeId) -> Result<()> {
        let Some(stream) = self.streams.write().remove(&volume) else { return Ok(()) };
        // Deferred appends (io.rs) are written now, to the slot still the stream's, so no
        // later sync of this stream writes into a slot freed below (its outcome does not
        // matter: the stream is going).
        let _ = stream.log.sync();
        let Some(area) = &self.area else { return Ok(()) };
        let device = self.stream_device(area, stream.slot)?;
        area.directory.lock().set(area.device.as_ref(), stream.slot, None)?;
        device.trim(Lba(0), device.block_count())?;
        if let Some(slots) = &stream.slots {
            slots.clear_all().map_err(redo_error)?;
        }
        Ok(())
    }
}

/// The LSN of the image the store holds of a volume's page (`None`: no image).
pub(crate) fn image_lsn(volume: &VolumeRef, page: u64) -> Result<Option<Lsn>> {
    let (chunk, page_no) = volume.volume.locate(page)?;
    Ok(stored_lsn(volume, chunk, page_no))
}

/// [`image_lsn`] of a page already located in its chunk.
pub(crate) fn stored_lsn(volume: &VolumeRef, chunk: ChunkId, page: PageNo) -> Option<Lsn> {
    volume.pages.store().entry(chunk, page).map(|entry| entry.lsn)
}

/// The redo crate's errors in the node's classes.
pub(crate) fn redo_error(error: tundra_redo::Error) -> Error {
    let message = error.message().to_string();
    match error.kind() {
        tundra_redo::ErrorKind::Invalid => Error::Invalid(message),
        tundra_redo::ErrorKind::Corrupted => Error::Corrupted(message),
        tundra_redo::ErrorKind::Full => Error::NoSpace(message),
        tundra_redo::ErrorKind::Closed => Error::Closed(message),
        _ => Error::Io(message),
    }
}
